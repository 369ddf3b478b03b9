"""A real PenguiFlow flow on the guarded store, when ``penguiflow`` is installed.

Two nodes, ``plan`` then ``act``, run by PenguiFlow's own runtime with
``state_store=<the guarded store>``: the runtime events (``node_start``, ``node_success`` ...)
are saved by PenguiFlow itself. A middleware, which PenguiFlow calls right after
``save_event`` returned for the same event, records each one in the ledger as acknowledged.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
from typing import Any

from guarded.models import StoredEvent

from .calls import json_form
from .ledger import Ledger

FETCH_TIMEOUT = 30.0
"""Seconds one run may take before the driver gives up on it (a hung flow must not hang the demo)."""


def penguiflow_available() -> bool:
    """Whether the real ``penguiflow`` package can be imported."""
    return importlib.util.find_spec("penguiflow") is not None


class PenguiFlowWorkload:
    """Drives ``drivers`` concurrent runs of a two-node PenguiFlow flow until a deadline."""

    def __init__(self, store: Any, ledger: Ledger, *, drivers: int, seed: int) -> None:
        from penguiflow import Node, create

        self.ledger = ledger
        self.drivers = drivers
        self.rng = random.Random(seed)
        self.failures = 0

        async def plan(message: Any, ctx: Any) -> Any:
            return message.model_copy(update={"payload": {"question": message.payload, "plan": ["search"]}})

        async def act(message: Any, ctx: Any) -> Any:
            question = message.payload["question"]
            return message.model_copy(update={"payload": {"answer": f"answer to {question}"}})

        planner, actor = Node(plan, name="plan"), Node(act, name="act")
        self.flow = create(planner.to(actor), actor.to(), state_store=store, middlewares=[self._record])

    async def _record(self, event: Any) -> None:
        stored = StoredEvent.from_flow_event(event)
        if stored.trace_id is None:
            return
        key = (stored.trace_id, stored.kind, stored.node_id, stored.ts)
        self.ledger.event(key, json_form(stored.payload))
        self.ledger.penguiflow_events += 1

    async def run(self, deadline: float) -> None:
        """Run the flow; each driver emits a question and awaits its answer, until ``deadline``."""
        from penguiflow import Headers, Message

        flow = self.flow
        flow.run()
        loop = asyncio.get_running_loop()

        async def driver(number: int) -> None:
            asked = 0
            while loop.time() < deadline:
                message = Message(payload=f"q{number}-{asked}", headers=Headers(tenant="demo"))
                try:
                    await flow.emit(message, trace_id=message.trace_id)
                    await asyncio.wait_for(flow.fetch(trace_id=message.trace_id), FETCH_TIMEOUT)
                except (TimeoutError, RuntimeError):
                    self.failures += 1
                else:
                    self.ledger.penguiflow_runs += 1
                asked += 1
                await asyncio.sleep(self.rng.uniform(0.05, 0.15))

        try:
            await asyncio.gather(*(driver(number) for number in range(self.drivers)))
        finally:
            await flow.stop()


__all__ = ["PenguiFlowWorkload", "penguiflow_available"]
