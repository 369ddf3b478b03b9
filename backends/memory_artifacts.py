"""The in-memory backend's artifact store: the core's bounded local store
(:mod:`guarded.local_artifacts`), under the name it has always had here."""

from guarded.local_artifacts import (
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
