"""The identity of a runtime event, which makes appending one idempotent without a natural id."""

from __future__ import annotations

import hashlib

from .json_text import canonical_json, compact_and_canonical_json, compact_json
from .json_values import JSONObject


def event_fingerprint(event: JSONObject) -> str:
    """The SHA-256 (hex) of the canonical JSON (sorted keys, compact, ``ensure_ascii=False``) of an
    encoded runtime event (:data:`~guarded.codec.STORED_EVENT`): its trace id, ``ts`` as a float,
    kind, node name, node id and payload. Two saves of one event have one fingerprint."""
    identity = {**event, "ts": float(event["ts"])}  # type: ignore[arg-type]
    return _digest(canonical_json(identity))


def event_fingerprint_and_text(event: JSONObject) -> tuple[str, str]:
    """``(event_fingerprint(event), compact_json(event))``: the identity and the stored text of an
    encoded runtime event, written together when its ``ts`` is a float already (its identity is
    then the event itself)."""
    if type(event.get("ts")) is not float:
        return event_fingerprint(event), compact_json(event)
    text, canonical = compact_and_canonical_json(event)
    return _digest(canonical), text


def _digest(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


__all__ = ["event_fingerprint", "event_fingerprint_and_text"]
