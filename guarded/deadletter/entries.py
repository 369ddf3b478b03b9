"""What the dead-letter buffer holds: waiting writes, parked writes, and its statistics."""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ..codec import JSONObject, check_text, to_json_value
from ..errors import InvalidPayloadError


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A write that finally failed, waiting to be replayed.

    ``seq`` orders every entry of a spill file, across process restarts. ``key`` is the canonical
    JSON of the method's last-write-wins key (see :func:`canonical_key`), ``scope`` the trace or
    session the write belongs to, ``stamp`` the caller's call-order number (a later call of the
    same key has a larger stamp). ``size`` is the length in bytes of the encoded call; ``error``
    describes why the write failed.
    """

    seq: int
    method: str
    call: JSONObject
    key: str | None
    scope: str | None
    stamp: int
    enqueued_at: float
    size: int
    error: str


@dataclass(frozen=True, slots=True)
class ParkedWrite:
    """A write refused as bad data: kept with its reason for inspection, never replayed
    automatically. ``call`` is ``None`` when the call itself could not be encoded."""

    seq: int
    method: str
    call: JSONObject | None
    reason: str
    parked_at: float
    size: int


@dataclass(frozen=True, slots=True)
class DeadLetterStats:
    """A snapshot of a dead-letter buffer.

    ``depth`` counts waiting writes (memory and spill file), ``memory_entries`` /
    ``memory_bytes`` those also held in memory, ``disk_bytes`` the encoded size of those in the
    spill file, ``oldest_age`` the age in seconds of the oldest waiting write (0 when empty),
    ``parked`` the parked writes. The ``*_total`` fields count since the buffer was created.
    ``spill_path`` is the slot file in use (``None`` when memory only or while it is unavailable),
    ``spill_available`` whether it takes writes (``None`` without a configured path), and
    ``memory_only`` how many waiting writes are held in memory only (lost if the process dies).
    ``quarantined`` counts the unreadable rows in the spill file's quarantine table,
    ``quarantined_total`` those this buffer moved there (or found in an adopted file).
    ``refused_total`` counts the writes refused at the buffer's limits (never acknowledged).
    """

    depth: int
    memory_entries: int
    memory_bytes: int
    disk_bytes: int
    oldest_age: float
    parked: int
    enqueued_total: int
    replayed_total: int
    dropped_total: int
    parked_total: int
    superseded_total: int
    adopted_total: int = 0
    spill_path: str | None = None
    spill_available: bool | None = None
    memory_only: int = 0
    quarantined: int = 0
    quarantined_total: int = 0
    refused_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a JSON-ready mapping."""
        return {name: getattr(self, name) for name in self.__slots__}


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def canonical_key(key: Any) -> str | None:
    """The canonical JSON text of a last-write-wins key: a string, or a tuple as a JSON list.

    ``None`` stays ``None``. Raises :class:`~guarded.errors.InvalidPayloadError` for a key JSON
    cannot carry.
    """
    if key is None:
        return None
    kind = type(key)
    if kind is str:
        if _spelled_as_is(key):
            return f'"{key}"'
    elif kind is tuple:
        parts = []
        for part in key:
            if type(part) is str and _spelled_as_is(part):
                parts.append(f'"{part}"')
            elif part is None:
                parts.append("null")
            else:
                break
        else:
            return f"[{','.join(parts)}]"
    return _dumps(to_json_value(key, "key"))


def _spelled_as_is(text: str) -> bool:
    """Whether the encoder writes ``text`` between quotes unchanged (nothing to escape): the
    usual key, spelled without the encoder (``tests/deadletter/test_canonical_keys.py``)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _freeze(value: Any) -> Hashable:
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return _dumps(value)
    return value  # type: ignore[no-any-return]


_PLAIN = (str, type(None), int)


def index_key(key: Any) -> Hashable:
    """A hashable identity of a last-write-wins key, equal for a key and its :func:`canonical_key`
    read back (see :func:`index_key_of_canonical`); cheap for strings and flat tuples."""
    kind = type(key)
    if kind is str:
        return key  # type: ignore[no-any-return]
    if kind is tuple:
        for part in key:
            if type(part) not in _PLAIN:
                return _freeze(to_json_value(key, "key"))
        return key  # type: ignore[no-any-return]
    return _freeze(to_json_value(key, "key"))


def index_key_of_canonical(text: str) -> Hashable:
    """:func:`index_key` of the key whose canonical JSON is ``text``."""
    return _freeze(json.loads(text))


def readable_text(value: str) -> str:
    """``value`` with lone surrogates replaced, for error descriptions and reasons."""
    try:
        return check_text(value, "")
    except InvalidPayloadError:
        return value.encode("utf-8", "replace").decode("utf-8")


__all__ = [
    "DeadLetter",
    "DeadLetterStats",
    "ParkedWrite",
    "canonical_key",
    "index_key",
    "index_key_of_canonical",
    "readable_text",
]
