"""The application of the ``uvicorn --workers`` metrics test, as docs/metrics.md shows it: each
worker guards an in-memory store named ``web``; ``/save`` makes one guarded call and answers the
worker's pid; ``/metrics`` serves every worker's metrics through a ``MultiProcessCollector``."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from guarded import guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig, GuardConfig

store = guard(InMemoryStateStore(), name="web", config=GuardConfig(dead_letter=DeadLetterConfig(path=None)))


async def save(request: Request) -> PlainTextResponse:
    await store.save_memory_state("key", {"worker": os.getpid()})
    return PlainTextResponse(str(os.getpid()))


def metrics_app() -> Any:
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # reads every worker's files in PROMETHEUS_MULTIPROC_DIR
    return make_asgi_app(registry)


app = Starlette(routes=[Route("/save", save), Mount("/metrics", app=metrics_app())])
