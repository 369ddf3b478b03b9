"""Policy overrides, lifecycle pass-through, and degraded artifact storage."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.extension import Kind
from guarded.models import ArtifactScope
from guarded.policy_table import PolicyTable
from guarded.testing import Fault, FaultPlan, FaultyStore
from tests.support.metrics import calls

from .support import fast_config


def test_patching_kind_makes_a_read_repeat_safe_unless_told_otherwise() -> None:
    table = PolicyTable.for_state_store()
    assert table.get("ping").repeat_safe is False  # unknown name: never repeated blindly
    patched = table.with_overrides({"ping": {"kind": "read"}})
    assert patched.get("ping").kind is Kind.READ
    assert patched.get("ping").repeat_safe is True
    consume = table.with_overrides({"take": {"kind": "consume"}})
    assert consume.get("take").repeat_safe is False
    explicit = table.with_overrides({"ping": {"kind": "read", "repeat_safe": False}})
    assert explicit.get("ping").repeat_safe is False


class ClosingStore(InMemoryStateStore):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1
        raise RuntimeError("close failed loudly")


@pytest.mark.asyncio
async def test_lifecycle_methods_pass_through_unguarded() -> None:
    inner = ClosingStore()
    store = guard(inner, registry=CollectorRegistry())
    assert "close" not in controller(store).guarded_methods()
    assert "save_event" in controller(store).guarded_methods()
    with pytest.raises(RuntimeError, match="close failed loudly"):
        await store.close()
    assert inner.closed == 1


def artifact_failure_plan() -> FaultPlan:
    return FaultPlan.always(
        Fault.error_before(ConnectionError("backend down")),
        methods=["artifact_store.put_bytes", "artifact_store.put_text", "artifact_store.get"],
    )


@pytest.mark.lenient  # as in production: the refused put returns
@pytest.mark.asyncio
async def test_a_put_nothing_can_hold_is_refused_and_its_copy_readable_in_this_process() -> None:
    """Dead letters off: the put cannot be kept; it is refused (never ``fallback``), and answers
    the reference of its copy in this process, which reads here see."""
    registry = CollectorRegistry()
    inner = InMemoryStateStore()
    store: Any = guard(FaultyStore(inner, artifact_failure_plan()), registry=registry, config=fast_config())
    scope = ArtifactScope(session_id="s1", trace_id="t1")
    ref = await store.artifact_store.put_bytes(b"chart bytes", mime_type="image/png", scope=scope)
    assert ref is not None
    assert ref.size_bytes == len(b"chart bytes")
    assert await inner.artifact_store.exists(ref.id) is False  # the backend never got it
    assert await store.artifact_store.get(ref.id) == b"chart bytes"  # served from this process
    assert await store.artifact_store.exists(ref.id) is True
    assert [r.id for r in await store.artifact_store.list(scope=ArtifactScope(session_id="s1"))] == [ref.id]
    assert calls(registry, "artifact_store.put_bytes", "refused") == 1
    assert calls(registry, "artifact_store.put_bytes", "fallback") == 0
    assert await store.artifact_store.delete(ref.id) is True
    assert await store.artifact_store.exists(ref.id) is False


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_bad_artifact_data_is_rejected_not_kept() -> None:
    registry = CollectorRegistry()
    store: Any = guard(InMemoryStateStore(), registry=registry, config=fast_config())
    ref = await store.artifact_store.put_bytes(b"x", meta={"bad": float("nan")})
    assert ref is None  # refused as bad data: nothing stored anywhere
    assert calls(registry, "artifact_store.put_bytes", "rejected") == 1
