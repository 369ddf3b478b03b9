"""The in-memory backend's artifact store: the core's bounded local store
(:mod:`guarded.durability.local_artifacts`), under the name it has always had here."""

from guarded.durability.local_artifacts import (
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
