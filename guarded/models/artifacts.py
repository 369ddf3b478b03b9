"""Artifact records and the ``ArtifactStore`` protocol (spec 000, "Artifact Store")."""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field


class ArtifactScope(BaseModel):
    """Access-control metadata stored with an artifact (enforced by the HTTP layer, not the store)."""

    tenant_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    trace_id: str | None = None

    def matches(self, artifact_scope: ArtifactScope | None) -> bool:
        """Whether an artifact with ``artifact_scope`` passes this filter (``None`` fields are wildcards)."""
        for name in ("tenant_id", "user_id", "session_id", "trace_id"):
            wanted = getattr(self, name)
            if wanted is None:
                continue
            actual = getattr(artifact_scope, name) if artifact_scope is not None else None
            if actual != wanted:
                return False
        return True


class ArtifactRef(BaseModel):
    """Compact reference to a stored artifact; the only artifact data that reaches an LLM."""

    id: str
    mime_type: str | None = None
    size_bytes: int | None = None
    filename: str | None = None
    sha256: str | None = None
    scope: ArtifactScope | None = None
    namespace: str | None = None
    source: dict[str, Any] = Field(default_factory=dict)


class ArtifactRetentionConfig(BaseModel):
    """Retention limits an artifact store enforces."""

    ttl_seconds: int = 3600
    max_artifact_bytes: int = 50 * 1024 * 1024
    max_session_bytes: int = 500 * 1024 * 1024
    max_trace_bytes: int = 100 * 1024 * 1024
    max_artifacts_per_trace: int = 100
    max_artifacts_per_session: int = 1000
    cleanup_strategy: Literal["lru", "fifo", "none"] = "lru"


@runtime_checkable
class ArtifactStore(Protocol):
    """Binary / large-text storage reached through a state store's ``artifact_store`` property."""

    async def put_bytes(
        self,
        data: bytes,
        *,
        mime_type: str | None = None,
        filename: str | None = None,
        namespace: str | None = None,
        scope: ArtifactScope | None = None,
        meta: dict[str, Any] | None = None,
    ) -> ArtifactRef: ...

    async def put_text(
        self,
        text: str,
        *,
        mime_type: str = "text/plain",
        filename: str | None = None,
        namespace: str | None = None,
        scope: ArtifactScope | None = None,
        meta: dict[str, Any] | None = None,
    ) -> ArtifactRef: ...

    async def get(self, artifact_id: str) -> bytes | None: ...
    async def get_ref(self, artifact_id: str) -> ArtifactRef | None: ...
    async def delete(self, artifact_id: str) -> bool: ...
    async def exists(self, artifact_id: str) -> bool: ...
    async def list(self, *, scope: ArtifactScope | None = None) -> list[ArtifactRef]: ...
