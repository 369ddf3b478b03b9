"""A real PenguiFlow ``ReactPlanner`` over ``guard(PostgresStateStore)``, driven by a scripted LLM.

Shared by tests/interop/test_planner_pause.py and its worker process
(tests/interop/_planner_worker.py). Nothing here talks to a network: the planner's LLM is a
:class:`ScriptedLLM` that answers pre-written JSON actions in order (PenguiFlow's
``JSONLLMClient`` protocol, ``penguiflow/planner/models.py``).

The agent is a refund desk: ``lookup_order`` reads an order, ``request_approval`` pauses the
planner for a human (``ctx.pause("approval_required", ...)``, the HITL seam of spec 000
"ReactPlanner Integration"), ``issue_refund`` runs once the run is resumed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from penguiflow.catalog import build_catalog, tool
from penguiflow.node import Node
from penguiflow.planner import ReactPlanner, ToolContext
from penguiflow.registry import ModelRegistry
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from guarded import guard
from guarded.backends.hybrid_store import HybridStateStore
from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.redis import RedisStateStore
from guarded.config import DeadLetterConfig, GuardConfig, RetryConfig, TimeoutConfig

ORDER_ID = "A-17"
AMOUNT = 42.5
ORDER_STATUS = "delivered-damaged"
"""What ``lookup_order`` observes; the resumed process must see it in its LLM prompt."""
REFUND_ID = f"R-{ORDER_ID}"
FINAL_ANSWER = f"Refund {REFUND_ID} of {AMOUNT} issued for order {ORDER_ID}."
APPROVAL = "approved by finance (ticket 991)"
QUERY = f"Customer asks for a refund of order {ORDER_ID}."
RESUME_MARKER = "Resume input: "
"""How PenguiFlow renders ``resume(token, user_input=...)`` into the prompt (``prompts.py``)."""


class OrderQuery(BaseModel):
    order_id: str


class OrderInfo(BaseModel):
    order_id: str
    status: str
    amount: float


class ApprovalRequest(BaseModel):
    order_id: str
    amount: float


class Approval(BaseModel):
    approved: bool


class RefundRequest(BaseModel):
    order_id: str
    amount: float


class RefundReceipt(BaseModel):
    refund_id: str


@tool(desc="Look up an order by id", side_effects="read")
async def lookup_order(args: OrderQuery, ctx: ToolContext) -> OrderInfo:
    return OrderInfo(order_id=args.order_id, status=ORDER_STATUS, amount=AMOUNT)


@tool(desc="Ask a human to approve a refund", side_effects="external")
async def request_approval(args: ApprovalRequest, ctx: ToolContext) -> Approval:
    await ctx.pause("approval_required", {"order_id": args.order_id, "amount": args.amount})
    raise AssertionError("ctx.pause() returns control to the caller of the planner")  # pragma: no cover


@tool(desc="Issue an approved refund", side_effects="write")
async def issue_refund(args: RefundRequest, ctx: ToolContext) -> RefundReceipt:
    return RefundReceipt(refund_id=f"R-{args.order_id}")


def action(next_node: str, **args: Any) -> dict[str, Any]:
    """One planner action in PenguiFlow's unified format (``next_node`` + ``args``)."""
    return {"next_node": next_node, "args": args}


PAUSE_SCRIPT: tuple[dict[str, Any], ...] = (
    action("lookup_order", order_id=ORDER_ID),
    action("request_approval", order_id=ORDER_ID, amount=AMOUNT),
)
"""What the LLM answers in the process that pauses."""

RESUME_SCRIPT: tuple[dict[str, Any], ...] = (
    action("issue_refund", order_id=ORDER_ID, amount=AMOUNT),
    action("final_response", answer=FINAL_ANSWER),
)
"""What the LLM answers in the process that resumes."""


class ScriptExhaustedError(RuntimeError):
    """The planner asked the scripted LLM for more actions than the script holds."""


class ScriptedLLM:
    """PenguiFlow ``JSONLLMClient`` answering pre-written actions in order; keeps every prompt."""

    def __init__(self, actions: Sequence[Mapping[str, Any]]) -> None:
        self._answers = [json.dumps(item) for item in actions]
        self.prompts: list[list[dict[str, Any]]] = []

    async def complete(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        response_format: Mapping[str, Any] | None = None,
        stream: bool = False,
        on_stream_chunk: Callable[[str, bool], None] | None = None,
    ) -> str:
        self.prompts.append([dict(message) for message in messages])
        if not self._answers:
            raise ScriptExhaustedError(f"the script ran out after {len(self.prompts) - 1} answers")
        answer = self._answers.pop(0)
        if stream and on_stream_chunk is not None:
            on_stream_chunk(answer, True)
        return answer

    def prompt_text(self, index: int) -> str:
        """Every message content of the ``index``-th prompt, joined."""
        return "\n".join(str(message.get("content", "")) for message in self.prompts[index])


def refund_catalog() -> list[Any]:
    """The refund desk's tools as a planner catalog."""
    registry = ModelRegistry()
    registry.register("lookup_order", OrderQuery, OrderInfo)
    registry.register("request_approval", ApprovalRequest, Approval)
    registry.register("issue_refund", RefundRequest, RefundReceipt)
    nodes = [
        Node(lookup_order, name="lookup_order"),
        Node(request_approval, name="request_approval"),
        Node(issue_refund, name="issue_refund"),
    ]
    return list(build_catalog(nodes, registry))


def build_planner(store: object, llm: ScriptedLLM) -> ReactPlanner:
    """The refund-desk planner, persisting pauses through ``store``."""
    return ReactPlanner(
        llm_client=llm,
        catalog=refund_catalog(),
        pause_enabled=True,
        state_store=store,
        max_iters=6,
    )


def guard_config(spill: str | None) -> GuardConfig:
    """Production layers with short budgets: a database that is down is found out in about a second,
    not the default 15 s of a critical write, and closing gives up draining after a second.
    ``spill`` ``None``: the default spill file (in the test's own state directory)."""
    dead_letter = (
        DeadLetterConfig(drain_timeout=1.0)
        if spill is None
        else DeadLetterConfig(path=spill, drain_timeout=1.0)
    )
    return GuardConfig(
        timeout=TimeoutConfig(attempt=1.0, deadline=2.0, critical_deadline=2.0),
        retry=RetryConfig(max_attempts=2, critical_max_attempts=2, initial_backoff=0.02, max_backoff=0.1),
        dead_letter=dead_letter,
    )


def guarded_postgres(dsn: str, schema: str, *, spill: str | None, registry: CollectorRegistry) -> Any:
    """``guard(PostgresStateStore.lazy(...))``: the pool opens on the first call, so a process can
    start while the database is down. Guard metrics go to ``registry``."""
    backend = PostgresStateStore.lazy(
        dsn,
        schema=schema,
        pool=PoolSettings(min_size=1, max_size=2, connect_timeout=2.0, command_timeout=5.0),
        registry=CollectorRegistry(),
        stats_interval=None,
    )
    return guard(backend, name="planner", config=guard_config(spill), registry=registry)


async def guarded_hybrid(
    dsn: str, schema: str, redis_url: str, prefix: str, *, spill: str | None, registry: CollectorRegistry
) -> Any:
    """``guard(HybridStateStore)``: pauses (and memory) in Redis under ``prefix``, the rest in the
    lazy PostgreSQL store of :func:`guarded_postgres`; each part guarded on its own."""
    hot = await RedisStateStore.connect(redis_url, prefix=prefix, socket_timeout=2.0)
    record = PostgresStateStore.lazy(
        dsn,
        schema=schema,
        pool=PoolSettings(min_size=1, max_size=2, connect_timeout=2.0, command_timeout=5.0),
        registry=CollectorRegistry(),
        stats_interval=None,
    )
    hybrid = HybridStateStore(hot=hot, record=record)
    return guard(hybrid, name="planner", config=guard_config(spill), registry=registry)


def final_answer(payload: Any) -> str | None:
    """The answer text of a ``PlannerFinish.payload`` (a mapping or an object with ``raw_answer``)."""
    if isinstance(payload, Mapping):
        value = payload.get("raw_answer", payload.get("answer"))
    else:
        value = getattr(payload, "raw_answer", None) or getattr(payload, "answer", None)
    return value if isinstance(value, str) else None
