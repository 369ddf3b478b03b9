"""Degraded artifact storage: when the backend cannot take an artifact, keep it in this process.

A ``put_bytes`` / ``put_text`` that fails for a reason other than bad data stores the artifact in
a bounded in-process store and returns its (valid, content-addressed) reference with outcome
``fallback``, so PenguiFlow never receives ``None`` where it expects an ``ArtifactRef``. Reads of
such an artifact (``get``, ``get_ref``, ``exists``) are answered from that store in this process;
``delete`` removes it from both; ``list`` adds the local ones to what the backend returns.
"""

from __future__ import annotations

from typing import Any

from guarded.backends.memory_artifacts import InMemoryArtifactStore

from ..call import Call, MethodSetup, Service
from ..classify import ErrorClass, classify, error_type, safe_message
from ..failure_log import FailureLog
from ..outcome import Outcome


class LocalArtifactFallbackLayer:
    """Runs between the fallback layer and the breaker of a guarded artifact store."""

    def __init__(self, local: InMemoryArtifactStore, failure_log: FailureLog) -> None:
        self.local = local
        self._log = failure_log

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        name = method.policy.name
        local = self.local
        log = self._log

        if name in ("put_bytes", "put_text"):
            put_locally = getattr(local, name)

            async def put(call: Call) -> Any:
                try:
                    return await inner(call)
                except Exception as exc:
                    if classify(exc) is ErrorClass.REJECTED:
                        raise
                    ref = await put_locally(*call.args, **call.kwargs)
                    call.error = exc
                    call.outcome = Outcome.FALLBACK
                    log.failure(
                        store=method.store_name,
                        method=method.label,
                        error_type=error_type(exc),
                        outcome="kept in process",
                        message=safe_message(exc),
                    )
                    return ref

            return put

        if name in ("get", "get_ref", "exists"):
            read_locally = getattr(local, name)

            async def read(call: Call) -> Any:
                if local.count:
                    found = await read_locally(*call.args, **call.kwargs)
                    if found:
                        return found
                return await inner(call)

            return read

        if name == "delete":

            async def delete(call: Call) -> Any:
                deleted_locally = bool(local.count) and await local.delete(*call.args, **call.kwargs)
                return await inner(call) or deleted_locally

            return delete

        if name == "list":

            async def listing(call: Call) -> Any:
                found = await inner(call)
                if local.count:
                    known = {ref.id for ref in found}
                    extra = [ref for ref in await local.list(**call.kwargs) if ref.id not in known]
                    return [*found, *extra]
                return found

            return listing

        return inner
