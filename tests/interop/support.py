"""Shared pieces of the PenguiFlow interoperability tests.

* :func:`guarded_postgres`: ``guard(PostgresStateStore)`` on the test's schema, reads returning
  PenguiFlow's own classes, closed (batches flushed) on the way out.
* :func:`audited_flow` / :func:`run_messages`: a small three-node PenguiFlow flow whose middle node
  fails its first attempt (so the audit log holds ``node_error`` and ``node_retry``, and, for a
  message that always fails, ``node_failed``), with a middleware recording every ``FlowEvent``
  the runtime emitted: the truth the stored history is compared with.
* :func:`guarded_store_from_env`: a ``module:callable`` for ``penguiflow-admin`` that returns the
  environment-configured PostgreSQL store behind ``guard()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from penguiflow import Headers, Message, Node, NodePolicy, PenguiFlow, create
from penguiflow.metrics import FlowEvent
from prometheus_client import CollectorRegistry

from guarded import GuardConfig, guard
from guarded.backends.postgres.factory import create_store
from guarded.codec import penguiflow_types
from tests.postgres.conftest import StoreFactory

NODE_NAMES = ("parse", "enrich", "finish")
FATAL = "fatal"
"""Payload of a message whose ``enrich`` step fails every attempt."""


@asynccontextmanager
async def guarded_postgres(
    make_store: StoreFactory, *, config: GuardConfig | None = None, name: str = "interop"
) -> AsyncIterator[Any]:
    """``guard(PostgresStateStore)`` with PenguiFlow's record types, on its own metrics registry."""
    backend = await make_store(types=penguiflow_types())
    async with guard(backend, name=name, registry=CollectorRegistry(), config=config) as store:
        yield store


@dataclass
class AuditedFlow:
    """A flow and every ``FlowEvent`` its runtime emitted, in emission order."""

    flow: PenguiFlow
    emitted: list[FlowEvent]

    def emitted_for(self, trace_id: str) -> list[FlowEvent]:
        return [event for event in self.emitted if event.trace_id == trace_id]


def audited_flow(store: Any) -> AuditedFlow:
    """``parse -> enrich -> finish`` on ``store``; ``enrich`` fails the first attempt of every
    message (one retry allowed) and every attempt of a :data:`FATAL` message."""
    attempts: dict[str, int] = {}

    async def parse(message: Message, ctx: Any) -> Message:
        return message.model_copy(update={"payload": str(message.payload).strip()})

    async def enrich(message: Message, ctx: Any) -> Message:
        attempts[message.trace_id] = attempts.get(message.trace_id, 0) + 1
        if message.payload == FATAL or attempts[message.trace_id] == 1:
            raise RuntimeError(f"enrich attempt {attempts[message.trace_id]} failed")
        return message.model_copy(update={"payload": f"{message.payload}!"})

    async def finish(message: Message, ctx: Any) -> str:
        return str(message.payload).upper()

    parse_node = Node(parse, name="parse")
    enrich_node = Node(enrich, name="enrich", policy=NodePolicy(max_retries=1, backoff_base=0.001))
    finish_node = Node(finish, name="finish")
    emitted: list[FlowEvent] = []

    async def record(event: FlowEvent) -> None:
        emitted.append(event)

    flow = create(
        (parse_node, [enrich_node]),
        (enrich_node, [finish_node]),
        (finish_node, []),
        state_store=store,
        middlewares=[record],
        emit_errors_to_rookery=True,
    )
    return AuditedFlow(flow, emitted)


async def run_messages(flow: PenguiFlow, payloads: Sequence[str]) -> list[tuple[Message, Any]]:
    """Run the flow, send one message per payload, wait for each result, stop the flow."""
    messages = [Message(payload=payload, headers=Headers(tenant="acme")) for payload in payloads]
    flow.run()
    try:
        for message in messages:
            await flow.emit(message)
        return [(message, await flow.fetch(trace_id=message.trace_id)) for message in messages]
    finally:
        await flow.stop()


async def guarded_store_from_env() -> Any:
    """``module:callable`` for ``penguiflow-admin``: the ``GUARDED_PG_*`` store behind ``guard()``."""
    return guard(await create_store(), name="admin", registry=CollectorRegistry())
