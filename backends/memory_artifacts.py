"""The in-memory backend's artifact store: the core's bounded local store
(:class:`guarded.backend.InMemoryArtifactStore`), under the name it has always had here."""

from guarded.backend import (
    ArtifactLimitError,
    ArtifactTooLargeError,
    InMemoryArtifactStore,
    artifact_id,
    sanitize_artifact_namespace,
)

__all__ = [
    "ArtifactLimitError",
    "ArtifactTooLargeError",
    "InMemoryArtifactStore",
    "artifact_id",
    "sanitize_artifact_namespace",
]
