"""Degraded artifact storage: an artifact the backend cannot take is kept in this process and
dead-lettered, so it reaches the backend once it recovers; one that cannot be held is refused.

A ``put_bytes`` / ``put_text`` that fails for a reason other than bad data:

* stores the artifact in a bounded in-process store, whose reads in this process (``get``,
  ``get_ref``, ``exists``, ``list``) are answered from there;
* is held by the dead-letter buffer of the guard's artifact durability
  (:class:`~guarded.durability.ports.DurabilityPorts`): committed to the artifact spill file
  before the caller returns (held in memory for a store that keeps nothing across processes, or
  with ``dead_letter.path=None``), keyed by the artifact id, and replayed into the backend's
  artifact store when it recovers. The id is content-addressed, so the replayed put yields the
  reference the caller got: outcome ``dead_lettered``;
* is refused when it cannot be held (past ``artifacts.spill_max_bytes``, a full disk, an unusable
  file, a put not committed by its deadline, or no artifact durability at all): a
  :class:`~guarded.errors.WriteNotKeptError`, counted and logged at ERROR, is raised, outcome
  ``refused``; in strict mode it reaches the caller. Outside strict mode the caller is answered
  the reference of the copy in this process (its :attr:`~guarded.errors.WriteNotKeptError.answer`),
  so PenguiFlow never gets ``None`` where it expects an ``ArtifactRef``; that copy dies with the
  process and is never replayed.

``delete`` removes an artifact from the process, from the buffer (a held put of it is never
replayed afterwards: it waits for a replay of it in flight and then takes it out) and from the
backend.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ..durability.ports import DurabilityPorts
from ..error_classes import error_type, no_wait_fixes
from ..errors import WriteNotKeptError
from ..local_artifacts import InMemoryArtifactStore
from ..observability.failure_log import FailureLog
from ..outcome import Outcome
from ..pipeline.call import Call, MethodSetup, Service
from ..policy import LocalFallback
from ..policy_table import PolicyTable

ARTIFACT_PUTS = tuple(
    policy.name for policy in PolicyTable.for_artifact_store() if policy.local_fallback is LocalFallback.PUT
)
"""The artifact writes: kept in process and dead-lettered when the backend cannot take them."""

RefuseUnheld = Callable[[str], WriteNotKeptError]
"""Counts and logs the refusal of a put of the given method that no buffer can hold (the guard
has no artifact durability), and returns the error that refuses it."""


def _artifact_id(ref: Any) -> str | None:
    found = getattr(ref, "id", None)
    return found if isinstance(found, str) else None


class LocalArtifactFallbackLayer:
    """Runs between the fallback layer and the breaker of a guarded artifact store."""

    def __init__(
        self,
        local: InMemoryArtifactStore,
        failure_log: FailureLog,
        ports: DurabilityPorts | None,
        *,
        refuse_unheld: RefuseUnheld,
    ) -> None:
        self.local = local
        self._log = failure_log
        self._refuse_unheld = refuse_unheld
        self._lifecycle = ports.lifecycle if ports is not None else None
        self._keeper = ports.keeper if ports is not None else None
        self._lookups = ports.lookups if ports is not None else None
        self._gate = ports.gate if ports is not None else None
        self._next_stamp = itertools.count(1).__next__
        """Call-order stamps of the artifact writes (the artifact buffer's only writer)."""

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
        put_locally = getattr(self.local, name)
        lifecycle = self._lifecycle
        keeper = self._keeper if method.policy.dead_letter else None
        refuse_unheld = self._refuse_unheld
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
                artifact_id = _artifact_id(ref)
                try:
                    if keeper is None or artifact_id is None:
                        raise refuse_unheld(name) from exc
                    # Bounded by the call's deadline: a commit that cannot finish in time is a put
                    # refused, never a call that waits for the disk.
                    kept = await keeper.hold(
                        name,
                        call.args,
                        call.kwargs,
                        key=artifact_id,
                        scope=None,
                        stamp=stamp,
                        error=error_type(exc),
                        deadline=call.deadline,
                    )
                except WriteNotKeptError as refusal:
                    refusal.answer = ref  # outside strict mode: the copy in this process
                    raise
                if not kept:
                    raise  # it cannot be encoded: parked with its reason
                call.settle(Outcome.DEAD_LETTERED, exc)
                log.dead_lettered(method, exc)
                return ref
            artifact_id = _artifact_id(result)
            if keeper is not None and artifact_id is not None:
                # The backend has it now: a held put of the same content need not be replayed.
                await keeper.supersede(name, artifact_id, stamp, None)
            return result

        return put

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
