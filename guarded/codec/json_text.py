"""JSON text of values already checked (by :mod:`.json_values` or a store's own walk), written fast:
compact, ``ensure_ascii=False``, ``allow_nan=False``, byte for byte what ``json.dumps`` writes with
those options; and stored JSON text read back fast (:func:`parse_json`, what ``json.loads`` returns).

CPython's C encoder, built once (``json.dumps`` builds an encoder on every call made with
options), writes any value. ``orjson`` writes the values :func:`orjson_ready` accepts, 4 to 8 times
faster and byte for byte what the C encoder writes there: the same escapes (``ensure_ascii=False``:
only ``"``, ``\\`` and control characters), the same shortest float digits, the same sorted key
order (code points), the same integers (``orjson`` refuses those beyond 64 bits: the C encoder takes
them). Outside ``[1e-4, 1e16)`` ``float.__repr__`` switches to exponent notation at bounds some
``orjson`` versions do not share, and NaN would become ``null``: such values, and anything ``orjson``
refuses (integers beyond 64 bits, lone surrogates, nesting beyond 255 levels), go the C encoder's
way. A probe at import turns the ``orjson`` way off if the installed version writes the probe values
differently (:data:`ORJSON_AGREES`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import orjson


def _refuse(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON-serialisable")


def _make_c_encoder(*, sort_keys: bool) -> Callable[[Any], str]:
    """A compact, ``ensure_ascii=False``, ``allow_nan=False`` JSON encoder.

    No circular-reference check: values reaching it were walked by a check that fails on a cycle
    with ``RecursionError``, or rebuilt by the strict codec (bounded depth).
    """
    if c_make_encoder is not None:
        chunks = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", sort_keys, False, False)
        return lambda value: "".join(chunks(value, 0))
    encoder = json.JSONEncoder(  # pragma: no cover - interpreters without the C accelerator
        ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys, check_circular=False
    )
    return encoder.encode  # pragma: no cover


_c_compact = _make_c_encoder(sort_keys=False)
_c_canonical = _make_c_encoder(sort_keys=True)

_MIN_FIXED = 1e-4
_MAX_FIXED = 1e16
_ORJSON_SCALARS = frozenset({str, int, bool, type(None)})


def fixed_float(value: float) -> bool:
    """Whether ``float.__repr__`` writes ``value`` without an exponent (``orjson`` then writes
    the same text): zero, or a magnitude in ``[1e-4, 1e16)``. False for NaN and infinities."""
    return _MIN_FIXED <= abs(value) < _MAX_FIXED or value == 0.0


def orjson_ready(value: dict[str, Any]) -> bool:
    """Whether ``orjson`` writes the ``dict`` ``value`` exactly as the C encoder would.

    Only ``dict`` (with ``str`` keys), ``list`` and exact scalar types, every float passing
    :func:`fixed_float`. ``orjson`` may still refuse the value (an integer beyond 64 bits, a lone
    surrogate, nesting beyond 255 levels): callers catch :class:`orjson.JSONEncodeError`.
    """
    # The usual scalars are tested inline: a call per item would cost more than the test.
    scalars = _ORJSON_SCALARS
    for key, item in value.items():
        if type(key) is not str or not (type(item) in scalars or _orjson_ready_other(item)):
            return False
    return True


def _orjson_ready_other(item: Any) -> bool:
    """:func:`orjson_ready` of a value that is not one of the plain scalars."""
    kind = type(item)
    if kind is float:
        magnitude: float = abs(item)
        return _MIN_FIXED <= magnitude < _MAX_FIXED or magnitude == 0.0
    if kind is dict:
        return orjson_ready(item)
    if kind is not list:
        return False
    scalars = _ORJSON_SCALARS
    return all(type(element) in scalars or _orjson_ready_other(element) for element in item)


def _orjson_agrees() -> bool:
    """Whether the installed ``orjson`` writes the probe values as the C encoder does."""
    probe = {
        "b": [0.0, -0.0, 1e-4, 0.00012345, 0.1, 1.5, 1e15, 9999999999999998.0, 1702857600.001],
        "a": ["", 'é\u2028🐧\x00\x1f\x7f"\\/\ue000', 2**63, -(2**63), 2**64 - 1, True, None],
        "é": {"z": {}, "E": [], "e": 1},
    }
    try:
        return orjson.dumps(probe).decode() == _c_compact(probe) and orjson.dumps(
            probe, option=orjson.OPT_SORT_KEYS
        ).decode() == _c_canonical(probe)
    except orjson.JSONEncodeError:  # pragma: no cover - a much older orjson
        return False


ORJSON_AGREES = _orjson_agrees()
"""Whether :func:`orjson_ready` values may be written by ``orjson`` (checked once, at import)."""


def _make_encoder(c_encoder: Callable[[Any], str], orjson_options: int) -> Callable[[Any], str]:
    if not ORJSON_AGREES:  # pragma: no cover - an orjson that writes the probe differently
        return c_encoder
    dumps, refused = orjson.dumps, orjson.JSONEncodeError

    def encode(value: Any) -> str:
        if type(value) is dict:
            try:
                if orjson_ready(value):
                    return dumps(value, option=orjson_options).decode()
            except (refused, RecursionError):
                pass  # the C encoder writes it, or raises what it raises
        return c_encoder(value)

    return encode


compact_json = _make_encoder(_c_compact, 0)
"""The JSON text of a checked value, its keys in their order (``ValueError`` for NaN or an
infinity, ``TypeError`` for what JSON cannot carry)."""
canonical_json = _make_encoder(_c_canonical, orjson.OPT_SORT_KEYS)
""":data:`compact_json` with the keys of every object sorted: one text per value (an identity)."""


def compact_and_canonical_json(value: Any) -> tuple[str, str]:
    """``(compact_json(value), canonical_json(value))`` with :func:`orjson_ready` walked once, not
    twice (a runtime event is written both ways: its stored text and its identity). The choice is
    :func:`_make_encoder`'s: ``orjson`` when ready and it takes the value, else the C encoder."""
    if ORJSON_AGREES and type(value) is dict:
        try:
            if orjson_ready(value):
                return orjson.dumps(value).decode(), orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except (orjson.JSONEncodeError, RecursionError):
            pass
    return _c_compact(value), _c_canonical(value)


_HUGE = 2.0**63
"""``orjson`` reads an integer beyond 64 bits as a float of at least this magnitude."""


def _holds_huge_float(value: Any) -> bool:
    """Whether a float of magnitude :data:`_HUGE` or more is anywhere in ``value`` (a parsed
    ``dict`` or ``list``)."""
    items: Any = value.values() if type(value) is dict else value
    for item in items:
        kind = type(item)
        if kind is float:
            if not -_HUGE < item < _HUGE:
                return True
        elif (kind is dict or kind is list) and _holds_huge_float(item):
            return True
    return False


def _orjson_parses_alike() -> bool:
    """Whether the installed ``orjson`` reads the probe text as ``json.loads`` does."""
    probe = (
        '{"a":[0.1,-0.0,1e-7,1.5e300,5e-324,123456789.123456789,9223372036854775807,'
        "-9223372036854775808,18446744073709551615,-0,true,false,null],"
        '"\\u00e9\\ud83d\\ude00\\u0000":"x","b":{},"b":[]}'
    )
    try:
        return repr(orjson.loads(probe)) == repr(json.loads(probe))
    except orjson.JSONDecodeError:  # pragma: no cover - a much older orjson
        return False


_ORJSON_PARSES_ALIKE = _orjson_parses_alike()


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``: the same value, or the same error, faster.

    ``orjson`` reads the text; what it reads, it reads as ``json.loads`` does (the same floats, the
    last of duplicate keys wins), except an integer beyond 64 bits, which it reads as a float: a
    result holding a float of that magnitude is read again by ``json.loads``. What ``orjson``
    refuses and ``json.loads`` takes (NaN and infinities, numbers beyond a float's range, lone
    surrogates, a byte order mark, UTF-16 or UTF-32 bytes, deeper nesting), and every error, goes
    to ``json.loads``.
    """
    if _ORJSON_PARSES_ALIKE and (type(text) is str or type(text) is bytes):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        else:
            kind = type(value)
            if kind is dict or kind is list:
                if not _holds_huge_float(value):
                    return value
            elif kind is not float or -_HUGE < value < _HUGE:
                return value
    return json.loads(text)


__all__ = [
    "ORJSON_AGREES",
    "canonical_json",
    "compact_and_canonical_json",
    "compact_json",
    "fixed_float",
    "orjson_ready",
    "parse_json",
]
