"""The ``bad`` fault: payloads that can never be stored, and valid ones that look suspicious.

Refused (README "The codec"): NaN, lone surrogates, non-JSON objects, and an artifact larger
than the store's ``max_artifact_bytes``. The guard must park each refused write in its
dead-letter buffer with the reason (artifacts, which are never parked, are rejected with outcome
``rejected``) and never raise or crash.

Accepted: strings containing NUL. JSON carries them and the PostgreSQL backend escapes them in
text columns, so they must be stored exactly; they are recorded as ordinary acknowledged writes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from guarded.models import (
    ArtifactScope,
    StateUpdate,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)

from .calls import ESCAPED, attempt, json_form
from .ledger import BadWrite, Ledger, WriteKind

NAN = float("nan")
LONE_SURROGATE = "\udc80"


async def send_bad_payloads(store: Any, ledger: Ledger, burst: int, *, max_artifact_bytes: int) -> int:
    """Send one burst of refused writes and NUL-bearing valid writes through ``store``; returns how
    many refused writes were sent. ``burst`` numbers the burst (keys never collide)."""
    tag = f"bad-{burst}"
    trace = f"{tag}-trace"
    refused: list[tuple[BadWrite, Callable[[], Awaitable[Any]]]] = [
        (
            BadWrite("NaN in an event payload", "save_event", "parked"),
            lambda: store.save_event(
                StoredEvent(trace, time.time(), "node_error", "tool", tag, {"score": NAN})
            ),
        ),
        (
            BadWrite("lone surrogate in a memory state", "save_memory_state", "parked"),
            lambda: store.save_memory_state(
                f"demo:{tag}:memory", {"turns": [f"broken {LONE_SURROGATE} text"], "health": "healthy"}
            ),
        ),
        (
            BadWrite("NaN in a task result", "save_task", "parked"),
            lambda: store.save_task(
                TaskState(
                    task_id=f"{tag}-task",
                    session_id=tag,
                    status=TaskStatus.COMPLETE,
                    task_type=TaskType.BACKGROUND,
                    priority=0,
                    context_snapshot=TaskContextSnapshot(session_id=tag, task_id=f"{tag}-task"),
                    result={"score": NAN},
                    updated_at=datetime.now(UTC),
                )
            ),
        ),
        (
            BadWrite("lone surrogate key in a pause payload", "save_planner_state", "parked"),
            lambda: store.save_planner_state(f"{tag}-pause", {LONE_SURROGATE: "approve?"}),
        ),
        (
            BadWrite("infinity in a progress update", "save_update", "parked"),
            lambda: store.save_update(
                StateUpdate(
                    session_id=tag,
                    task_id=f"{tag}-task",
                    update_id=f"{tag}-update",
                    update_type=UpdateType.PROGRESS,
                    content={"eta_seconds": float("inf")},
                )
            ),
        ),
    ]
    artifacts = getattr(store, "artifact_store", None)
    if artifacts is not None:
        oversized = b"\x00" * (max_artifact_bytes * 2)
        refused.append(
            (
                BadWrite("oversized artifact", "artifact_store.put_bytes", "rejected"),
                lambda: artifacts.put_bytes(oversized, mime_type="application/octet-stream", namespace=tag),
            )
        )
    for bad, send in refused:
        ledger.bad.append(bad)
        await attempt(ledger, send())

    nul_payload = {"text": "before\x00after", "note": "NUL is valid JSON text"}
    event = StoredEvent(trace, time.time(), "tool_output", "tool", f"{tag}-nul", nul_payload)
    if await attempt(ledger, store.save_event(event)) is not ESCAPED:
        ledger.event((trace, event.kind, event.node_id, event.ts), json_form(nul_payload))
        ledger.nul_writes += 1
    nul_memory = {"turns": [{"role": "user", "content": "paste:\x00\x00end"}], "health": "healthy"}
    key = f"demo:{tag}:nul-memory"
    if await attempt(ledger, store.save_memory_state(key, nul_memory)) is not ESCAPED:
        ledger.upsert(WriteKind.MEMORY, key, json_form(nul_memory))
        ledger.nul_writes += 1
    if artifacts is not None:
        ref = await attempt(
            ledger,
            artifacts.put_text("log line\x00with NUL", namespace=tag, scope=ArtifactScope(session_id=tag)),
        )
        if ref is not ESCAPED and ref is not None:
            ledger.artifacts[ref.id] = ref.sha256
            ledger.nul_writes += 1
    return len(refused)


__all__ = ["LONE_SURROGATE", "NAN", "send_bad_payloads"]
