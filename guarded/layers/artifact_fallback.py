"""Degraded artifact storage: an artifact the backend cannot take is kept in this process and
dead-lettered, so it reaches the backend once it recovers.

A ``put_bytes`` / ``put_text`` that fails for a reason other than bad data:

* stores the artifact in a bounded in-process store and returns its (valid, content-addressed)
  reference, so PenguiFlow never receives ``None`` where it expects an ``ArtifactRef``, and reads
  of it in this process (``get``, ``get_ref``, ``exists``, ``list``) are answered from there;
* when the guard has an artifact durability (:class:`~guarded.durability.ports.DurabilityPorts`) and
  the policy marks the put ``dead_letter``, is also held by its dead-letter buffer (committed to
  the artifact spill file before the caller returns), keyed by the artifact id, and replayed into
  the backend's artifact store when it recovers; the id is content-addressed, so the replayed put
  yields the reference the caller already has. Outcome ``dead_lettered``;
* else (no durability, or the held artifacts would exceed ``artifacts.spill_max_bytes``, or the
  buffer cannot take it) stays in this process only: outcome ``fallback``, logged.

``delete`` removes an artifact from the process, from the buffer (a held put of it is never
replayed afterwards: it waits for a replay of it in flight and then takes it out) and from the
backend.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any

from ..durability.local_artifacts import InMemoryArtifactStore
from ..durability.ports import DurabilityPorts
from ..errors import GuardClosedError
from ..observability.failure_log import FailureLog
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.classify import error_type, no_wait_fixes, safe_message
from ..policy import LocalFallback
from ..policy_table import PolicyTable

logger = logging.getLogger("guarded.artifacts")

ARTIFACT_PUTS = tuple(
    policy.name for policy in PolicyTable.for_artifact_store() if policy.local_fallback is LocalFallback.PUT
)
"""The artifact writes: kept in process and dead-lettered when the backend cannot take them."""
_OVERHEAD = 1024
"""Bytes added to the estimate of a held put for its JSON envelope and short arguments."""


def held_size(content: Any, kwargs: Mapping[str, Any]) -> int:
    """An upper estimate of what a held put takes in the spill file (its encoded call): the
    ``content`` as base64 (bytes) or JSON text (a string), plus the other arguments."""
    others = {key: value for key, value in kwargs.items() if value is not content}
    try:
        size = _OVERHEAD + len(json.dumps(others, default=str, ensure_ascii=False).encode("utf-8", "replace"))
    except (TypeError, ValueError, RecursionError):  # the buffer refuses such arguments anyway
        size = _OVERHEAD
    if isinstance(content, bytes | bytearray | memoryview):
        return size + 4 * ((len(content) + 2) // 3)
    if isinstance(content, str):
        return size + len(json.dumps(content, ensure_ascii=False).encode("utf-8", "replace"))
    return size


def _artifact_id(ref: Any) -> str | None:
    found = getattr(ref, "id", None)
    return found if isinstance(found, str) else None


class LocalArtifactFallbackLayer:
    """Runs between the fallback layer and the breaker of a guarded artifact store."""

    def __init__(
        self,
        local: InMemoryArtifactStore,
        failure_log: FailureLog,
        ports: DurabilityPorts | None = None,
        *,
        spill_max_bytes: int = 0,
    ) -> None:
        self.local = local
        self._log = failure_log
        ports = ports if spill_max_bytes > 0 else None
        self._lifecycle = ports.lifecycle if ports is not None else None
        self._keeper = ports.keeper if ports is not None else None
        self._lookups = ports.lookups if ports is not None else None
        self._gate = ports.gate if ports is not None else None
        self.spill_max_bytes = spill_max_bytes
        self.kept_in_process_only = 0
        """Puts the backend could not take that were kept in this process only (not held durably)."""
        self._next_stamp = itertools.count(1).__next__
        """Call-order stamps of the artifact writes (the artifact buffer's only writer)."""
        self._admission = asyncio.Lock()

    def moved(self) -> None:
        """The guard moved to a new event loop: a put of the old one may hold the admission for
        good (its loop closed); a new lock serves the new loop."""
        self._admission = asyncio.Lock()

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        name = method.policy.name
        local = self.local
        kind = method.policy.local_fallback

        if kind is LocalFallback.PUT:
            return self._wrap_put(inner, method)

        if kind is LocalFallback.READ:
            read_locally = getattr(local, name)

            async def read(call: Call) -> Any:
                if local.count:
                    found = await read_locally(*call.args, **call.kwargs)
                    if found:
                        return found
                return await inner(call)

            return read

        if kind is LocalFallback.DELETE:
            return self._wrap_delete(inner)

        if kind is LocalFallback.LIST:

            async def listing(call: Call) -> Any:
                found = await inner(call)
                if local.count:
                    known = {ref.id for ref in found}
                    extra = [ref for ref in await local.list(**call.kwargs) if ref.id not in known]
                    return [*found, *extra]
                return found

            return listing

        return inner

    def _wrap_put(self, inner: Service, method: MethodSetup) -> Service:
        name = method.policy.name
        content_of = method.policy.value  # the put's content, for the size of a held put
        put_locally = getattr(self.local, name)
        held_here = method.policy.dead_letter
        lifecycle = self._lifecycle if held_here else None
        keeper = self._keeper if held_here else None
        next_stamp = self._next_stamp
        log = self._log

        async def put(call: Call) -> Any:
            if lifecycle is not None:
                await lifecycle.ensure_open()  # once: what a previous process left starts replaying
            stamp = next_stamp()
            try:
                result = await inner(call)
            except Exception as exc:
                if no_wait_fixes(exc):
                    raise
                ref = await put_locally(*call.args, **call.kwargs)
                content = content_of(call.args, call.kwargs) if content_of is not None else None
                held = await self._hold(name, call, ref, stamp, exc, content)
                call.settle(Outcome.DEAD_LETTERED if held else Outcome.FALLBACK, exc)
                log.failure(
                    store=method.store_name,
                    method=method.label,
                    error_type=error_type(exc),
                    outcome=Outcome.DEAD_LETTERED.value if held else "kept in process only",
                    message=safe_message(exc),
                )
                return ref
            artifact_id = _artifact_id(result)
            if keeper is not None and artifact_id is not None:
                # The backend has it now: a held put of the same content need not be replayed.
                await keeper.supersede(name, artifact_id, stamp, None)
            return result

        return put

    async def _hold(
        self, name: str, call: Call, ref: Any, stamp: int, exc: BaseException, content: Any
    ) -> bool:
        """Dead-letter a put kept locally, within ``spill_max_bytes``; whether it is held."""
        keeper, lookups = self._keeper, self._lookups
        artifact_id = _artifact_id(ref)
        if keeper is None or lookups is None or artifact_id is None:
            return False
        size = held_size(content, call.kwargs)
        async with self._admission:  # one admission at a time: the cap is never overshot
            stats = await lookups.stats()
            held = max(stats.disk_bytes, stats.memory_bytes)
            if held + size > self.spill_max_bytes:
                self._kept_in_process_only(name, size, held)
                return False
            try:
                kept = await keeper.hold(
                    name,
                    call.args,
                    call.kwargs,
                    key=artifact_id,
                    scope=None,
                    stamp=stamp,
                    error=error_type(exc),
                )
            except GuardClosedError:
                raise  # the guard is closed: refused, never answered as kept
            except Exception:
                logger.exception(
                    "an artifact put could not be dead-lettered; it is kept in this process only",
                    extra={"event": "artifact_not_held", "store": lookups.store_name, "method": name},
                )
                kept = False
        if not kept:
            self.kept_in_process_only += 1
        return kept

    def _kept_in_process_only(self, name: str, size: int, held: int) -> None:
        self.kept_in_process_only += 1
        logger.warning(
            "artifact spill cap reached (%d bytes held, %d more needed, artifacts.spill_max_bytes=%d): "
            "an artifact the backend could not take is kept in this process only",
            held,
            size,
            self.spill_max_bytes,
            extra={
                "event": "artifact_spill_full",
                "method": name,
                "held_bytes": held,
                "size": size,
                "kept_in_process_only": self.kept_in_process_only,
            },
        )

    def _wrap_delete(self, inner: Service) -> Service:
        local = self.local
        lifecycle, lookups, gate = self._lifecycle, self._lookups, self._gate
        next_stamp = self._next_stamp

        async def delete(call: Call) -> Any:
            if lifecycle is not None:
                await lifecycle.ensure_open()  # held puts of a previous process are known first
            deleted_locally = bool(local.count) and await local.delete(*call.args, **call.kwargs)
            artifact_id = call.args[0] if call.args else call.kwargs.get("artifact_id")
            if lookups is None or gate is None or lookups.is_empty or not isinstance(artifact_id, str):
                return await inner(call) or deleted_locally
            # Take held puts of the artifact out of the buffer so no replay brings it back: first
            # wait for a replay of it in flight, and hold replays of it off until the delete ends.
            stamp = next_stamp()
            slots = [slot for slot in (gate.slot(put, artifact_id) for put in ARTIFACT_PUTS) if slot]
            entered = []
            try:
                for slot in slots:
                    if not gate.try_enter(slot, stamp):
                        await gate.enter(slot, stamp)
                    entered.append(slot)
                taken = False
                for put in ARTIFACT_PUTS:
                    taken = await lookups.take(put, artifact_id) is not None or taken
                return await inner(call) or deleted_locally or taken
            finally:
                for slot in entered:
                    gate.leave(slot, stamp)

        return delete
