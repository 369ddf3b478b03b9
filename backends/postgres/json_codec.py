"""How values are written to and read from PostgreSQL, losslessly.

**Payloads are stored in ``json`` columns, not ``jsonb``.** ``json`` keeps an exact copy of
the text we send; ``jsonb`` re-encodes it, and that is lossy for payloads PenguiFlow stores:

* ``jsonb`` rejects ``\\u0000`` in strings (an escape would be needed on every string and key);
* ``jsonb`` turns numbers into ``numeric`` and prints them back without exponent, so the float
  ``1e16`` comes back as the integer ``10000000000000000``, ``1.5e300`` as a 301-digit integer
  that is *not equal* to the float, and ``-0.0`` as ``0.0``;
* ``jsonb`` reorders object keys.

``json`` round-trips all of these byte for byte, is cheaper to write (validated, not converted)
and cheaper to read (no re-serialisation), and still supports the operators people use in
ad-hoc queries (``payload->>'latency_ms'``, ``json_each``; ``payload::jsonb`` for containment).
The spec advises against indexing payloads, so ``jsonb``'s GIN indexes are not missed.

**Text columns cannot hold NUL.** PostgreSQL ``text`` rejects the NUL character. Identifier and
label columns (trace ids, session ids, kinds, ...) therefore go through a reversible escape
with a private-use sentinel: ``U+E000`` becomes ``U+E000 U+E001`` and NUL becomes
``U+E000 U+E002``. Strings without either character -- all real ones -- are stored unchanged,
so ops queries see plain values. The escape is applied to query parameters too, so lookups
match. (Inside ``json`` text a NUL is simply the JSON escape ``\\u0000``.)

**Serialisation** has a fast path: a cheap walk (:func:`is_plain_json`) confirms the value is
made only of ``dict`` with ``str`` keys, ``list`` and exact scalar types, and CPython's C encoder
(built once, ``allow_nan=False``) writes it; the text is then checked to be valid UTF-8 (no lone
surrogates). Anything else -- tuples, other mappings, subclasses, non-string keys, NaN,
unserialisable objects -- goes through the strict codec :func:`guarded.codec.to_json_value`,
which accepts what is storable and refuses the rest with
:class:`~guarded.errors.InvalidPayloadError` naming the field path, before any I/O.

**Events** (:func:`~guarded.codec.orjson_ready`, used by
:func:`~guarded.backends.postgres.event_log.encode_event`) have a faster path still: when the walk
also finds every float in ``[1e-4, 1e16)`` (or zero), ``orjson`` writes the text, byte for byte
what the C encoder writes there (:mod:`guarded.codec.json_text` says why and when).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from guarded.codec import (
    ORJSON_AGREES,
    canonical_json,
    compact_json,
    fixed_float,
    float_argument,
    optional_text_argument,
    orjson_ready,
    parse_json,
    refusing,
    text_argument,
    to_json_value,
)
from guarded.errors import InvalidPayloadError

SENTINEL = "\ue000"
"""Escape character of the text-column escape (a private-use code point)."""
_ESCAPED_SENTINEL = "\ue000\ue001"
_ESCAPED_NUL = "\ue000\ue002"
NULL_KEY = SENTINEL
"""A value no escaped string can equal (a lone trailing sentinel): stands for ``None`` in key columns."""
_UNESCAPE = re.compile("\ue000([\ue001\ue002])")

loads_json = parse_json
"""Decode a ``json`` column (a ``str``): ``json.loads``, faster (:func:`guarded.codec.parse_json`)."""


# --- text columns ----------------------------------------------------------------------------------


def to_db_text(value: str) -> str:
    """The text-column form of ``value`` (unchanged unless it contains NUL or the sentinel)."""
    if "\x00" in value or SENTINEL in value:
        return value.replace(SENTINEL, _ESCAPED_SENTINEL).replace("\x00", _ESCAPED_NUL)
    return value


def to_db_text_opt(value: str | None) -> str | None:
    """:func:`to_db_text` that passes ``None`` through."""
    return None if value is None else to_db_text(value)


def from_db_text(value: str) -> str:
    """Invert :func:`to_db_text`."""
    if SENTINEL in value:
        return _UNESCAPE.sub(lambda match: "\x00" if match.group(1) == "\ue002" else SENTINEL, value)
    return value


def key_text(value: str | None) -> str:
    """A non-null key column value for an optional string: its escape, or :data:`NULL_KEY` for ``None``."""
    return NULL_KEY if value is None else to_db_text(value)


# --- argument checks -------------------------------------------------------------------------------

check_text = text_argument
"""``value`` when it is a ``str`` without lone surrogates (:func:`guarded.codec.text_argument`)."""
check_text_opt = optional_text_argument
""":func:`check_text` that accepts ``None`` (:func:`guarded.codec.optional_text_argument`)."""
to_float = float_argument
"""``value`` as a ``double precision`` (:func:`guarded.codec.float_argument`)."""


# --- JSON ------------------------------------------------------------------------------------------


_dumps = compact_json
_canonical_dumps = canonical_json
_SCALARS = frozenset({str, int, float, bool, type(None)})


def is_plain_json(value: Any) -> bool:
    """Whether ``value`` is made only of ``dict`` (with ``str`` keys), ``list`` and exact scalar types.

    For such a value the C encoder is lossless once it has refused NaN/infinity and the text is
    valid UTF-8: the cheap check that lets :func:`dump_json` skip the strict codec.
    """
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            item_kind = type(item)
            if item_kind not in _SCALARS and not (
                (item_kind is dict or item_kind is list) and is_plain_json(item)
            ):
                return False
        return True
    if kind is list:
        for item in value:
            item_kind = type(item)
            if item_kind not in _SCALARS and not (
                (item_kind is dict or item_kind is list) and is_plain_json(item)
            ):
                return False
        return True
    return kind in _SCALARS


def _fast(value: Any, encode: Callable[[Any], str]) -> str | None:
    """``encode(value)`` when ``value`` is plain JSON that encodes losslessly, else ``None``."""
    try:
        if not is_plain_json(value):
            return None
        text = encode(value)
        if not text.isascii():
            text.encode("utf-8")  # lone surrogates cannot be stored
        return text
    except (ValueError, RecursionError):  # NaN / infinity, a surrogate, a reference cycle
        return None


def _strict(value: Any, path: str, *, require_object: bool) -> Any:
    """The strict codec's plain copy of ``value``, or :class:`InvalidPayloadError` naming the path."""
    if require_object and not isinstance(value, Mapping):
        raise InvalidPayloadError(f"expected a mapping, got {type(value).__name__}", path=path)
    try:
        return to_json_value(value, path)
    except RecursionError:
        raise InvalidPayloadError("nested too deeply (a reference cycle?)", path=path) from None


def _encode_strict(encode: Callable[[Any], str], value: Any, path: str) -> str:
    try:
        return encode(value)
    except ValueError as exc:  # e.g. an integer beyond the interpreter's digit limit
        raise InvalidPayloadError(f"cannot be serialised as JSON: {exc}", path=path) from None


def dump_json(value: Any, path: str = "", *, require_object: bool = False) -> str:
    """Compact JSON text of ``value`` keeping key order; refuse what JSON cannot carry.

    Raises :class:`InvalidPayloadError` with ``path`` pointing at the offending value.
    ``require_object``: the top level must be a mapping.
    """
    if not require_object or type(value) is dict:
        text = _fast(value, _dumps)
        if text is not None:
            return text
    return _encode_strict(_dumps, _strict(value, path, require_object=require_object), path)


def dump_json_object(value: Any, path: str = "") -> str:
    """:func:`dump_json` for a value that must be a JSON object."""
    return dump_json(value, path, require_object=True)


def dump_canonical_pair(value: Any, path: str = "") -> tuple[str, str]:
    """The canonical (sorted keys) and the key-order-preserving texts of the JSON object ``value``.

    Validation as :func:`dump_json_object`. The canonical text is what fingerprints hash.
    """
    canonical = _fast(value, _canonical_dumps) if type(value) is dict else None
    if canonical is None:
        value = _strict(value, path, require_object=True)
        canonical = _encode_strict(_canonical_dumps, value, path)
    return canonical, _dumps(value)


__all__ = [
    "NULL_KEY",
    "ORJSON_AGREES",
    "SENTINEL",
    "check_text",
    "check_text_opt",
    "dump_canonical_pair",
    "dump_json",
    "dump_json_object",
    "fixed_float",
    "from_db_text",
    "is_plain_json",
    "key_text",
    "loads_json",
    "orjson_ready",
    "refusing",
    "to_db_text",
    "to_db_text_opt",
    "to_float",
]
