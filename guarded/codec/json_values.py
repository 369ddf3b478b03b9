"""Strict JSON values: what can be stored and read back unchanged.

Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` without lone surrogates,
mappings with ``str`` keys, lists and tuples (tuples come back as lists, JSON has no tuple).
Everything else is refused with :class:`~guarded.errors.InvalidPayloadError` naming the path
of the offending value, before any I/O. Strings containing NUL are valid JSON and accepted here;
backends whose storage rejects them (PostgreSQL JSONB) must escape them. Integers are accepted up
to the interpreter's limit for integer text (``sys.get_int_max_str_digits()``, 4,300 digits by
default); a longer one cannot be written as JSON and is refused.

Paths never copy payload contents: a list item is named by its index (``steps[3]``), a mapping
entry by its position and its key's type (``state[key #0 (str)]``, see :func:`key_path`), never
by the key itself, and reasons name the kind of problem, never the value.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any

from ..errors import InvalidPayloadError

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject = dict[str, JSONValue]

MAX_DEPTH = 256
"""Deeper nesting is refused (it is almost always a reference cycle)."""
_SAFE_INT_BITS = 2_000
"""Integers of at most this many bits have at most 603 digits, below any digit limit the
interpreter accepts (640 at least): only longer ones are checked against it."""


def key_path(path: str, position: int, key: object) -> str:
    """The path of the entry at ``position`` (0-based, in iteration order) of the mapping at
    ``path``: ``path[key #<position> (<type of the key>)]``. The key itself is never named: keys
    are payload (``{"ssn=078-05-1120": ...}``)."""
    return f"{path}[key #{position} ({type(key).__name__})]"


def _check_int(value: int, path: str) -> int:
    """Refuse an integer too long to be written as JSON text (the interpreter's digit limit)."""
    if value.bit_length() > _SAFE_INT_BITS:
        limit = sys.get_int_max_str_digits()
        if limit and abs(value) >= 10**limit:
            raise InvalidPayloadError(
                f"an integer of more than {limit} digits cannot be written as JSON "
                "(sys.get_int_max_str_digits())",
                path=path,
            )
    return value


def check_text(value: str, path: str) -> str:
    """Return ``value`` as a plain ``str``; refuse lone surrogates, which UTF-8 cannot encode."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidPayloadError(
                f"string contains a lone surrogate (at index {exc.start}), "
                "which is not valid Unicode and cannot be stored",
                path=path,
            ) from None
    return value if type(value) is str else str.__str__(value)


class NotPlain(Exception):
    """A fast path (:func:`plain_copy`, the record codecs' quick forms) met a value it leaves to
    the checked path, which returns the same result or the error naming the path."""


def plain_copy(value: Any, depth: int) -> JSONValue:
    """:func:`to_json_value` of a tree of exactly ``dict`` (``str`` keys), ``list``, ``tuple``,
    ASCII ``str``, ``None``, ``bool``, ``int`` of at most :data:`_SAFE_INT_BITS` bits and finite
    ``float``, copied without building a path; raises :class:`NotPlain` for anything else, which
    :func:`to_json_value` then walks with paths (the same copy, or the error naming the path).
    May also raise ``RecursionError`` (a reference cycle), which is handled the same way."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            return value  # type: ignore[no-any-return]
        raise NotPlain
    if value is None or kind is bool:
        return value  # type: ignore[no-any-return]
    if kind is int:
        if value.bit_length() <= _SAFE_INT_BITS:
            return value  # type: ignore[no-any-return]
        raise NotPlain
    if kind is float:
        if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
            return value  # type: ignore[no-any-return]
        raise NotPlain
    if depth >= MAX_DEPTH:
        raise NotPlain
    depth += 1
    if kind is dict:
        result: dict[str, JSONValue] = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise NotPlain
            result[key] = plain_copy(item, depth)
        return result
    if kind is list or kind is tuple:
        return [plain_copy(item, depth) for item in value]
    raise NotPlain


def to_json_value(value: Any, path: str = "", depth: int = 0) -> JSONValue:
    """Return a plain-JSON copy of ``value`` or raise :class:`InvalidPayloadError` naming its path."""
    try:
        return plain_copy(value, depth)
    except (NotPlain, RecursionError):
        return _checked_copy(value, path, depth)


def _checked_copy(value: Any, path: str, depth: int) -> JSONValue:
    """:func:`to_json_value` one value at a time, each with its path (for the error that names it)."""
    kind = type(value)
    if kind is str:
        return check_text(value, path)
    if value is None or kind is bool:
        return value  # type: ignore[no-any-return]
    if kind is int:
        return _check_int(value, path)
    if kind is float:
        if math.isfinite(value):
            return value  # type: ignore[no-any-return]
        raise InvalidPayloadError(f"{value!r} is not a valid JSON number", path=path)
    if depth >= MAX_DEPTH:
        raise InvalidPayloadError(f"nested deeper than {MAX_DEPTH} levels (a reference cycle?)", path=path)
    if isinstance(value, Mapping):
        result: dict[str, JSONValue] = {}
        for position, (key, item) in enumerate(value.items()):
            where = f"{path}[key #{position} ({type(key).__name__})]"  # key_path, inlined
            if not isinstance(key, str):
                raise InvalidPayloadError(
                    f"a mapping key is a {type(key).__name__}; JSON object keys must be strings",
                    path=where,
                )
            result[check_text(key, where)] = _checked_copy(item, where, depth + 1)
        return result
    if isinstance(value, list | tuple):
        return [_checked_copy(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    if isinstance(value, Enum):
        return _checked_copy(value.value, path, depth + 1)
    if isinstance(value, str):
        return check_text(value, path)
    if isinstance(value, int):
        return _check_int(int(value), path)
    if isinstance(value, float):
        return _checked_copy(float(value), path, depth)
    raise InvalidPayloadError(f"a {kind.__module__}.{kind.__qualname__} is not JSON-serialisable", path=path)


def to_json_object(value: Any, path: str = "") -> JSONObject:
    """Like :func:`to_json_value`, but the top level must be a mapping."""
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"expected a mapping, got {type(value).__name__}", path=path)
    result = to_json_value(value, path)
    assert isinstance(result, dict)
    return result
