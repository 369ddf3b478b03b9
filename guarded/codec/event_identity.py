"""The identity of a runtime event, which makes appending one idempotent without a natural id."""

from __future__ import annotations

import hashlib

from .json_text import canonical_json
from .json_values import JSONObject


def event_fingerprint(event: JSONObject) -> str:
    """The SHA-256 (hex) of the canonical JSON (sorted keys, compact, ``ensure_ascii=False``) of an
    encoded runtime event (:data:`~guarded.codec.STORED_EVENT`): its trace id, ``ts`` as a float,
    kind, node name, node id and payload. Two saves of one event have one fingerprint."""
    identity = {**event, "ts": float(event["ts"])}  # type: ignore[arg-type]
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()


__all__ = ["event_fingerprint"]
