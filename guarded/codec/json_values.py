"""Strict JSON values: what can be stored and read back unchanged.

Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` without lone surrogates,
mappings with ``str`` keys, lists and tuples (tuples come back as lists, JSON has no tuple).
Everything else is refused with :class:`~guarded.errors.InvalidPayloadError` naming the path
of the offending value, before any I/O. Strings containing NUL are valid JSON and accepted here;
backends whose storage rejects them (PostgreSQL JSONB) must escape them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

from ..errors import InvalidPayloadError

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject = dict[str, JSONValue]

MAX_DEPTH = 256
"""Deeper nesting is refused (it is almost always a reference cycle)."""


def check_text(value: str, path: str) -> str:
    """Return ``value`` as a plain ``str``; refuse lone surrogates, which UTF-8 cannot encode."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidPayloadError(
                f"string contains a lone surrogate (U+{ord(value[exc.start]):04X} at index {exc.start}), "
                "which is not valid Unicode and cannot be stored",
                path=path,
            ) from None
    return value if type(value) is str else str.__str__(value)


def to_json_value(value: Any, path: str = "", depth: int = 0) -> JSONValue:
    """Return a plain-JSON copy of ``value`` or raise :class:`InvalidPayloadError` naming its path."""
    kind = type(value)
    if kind is str:
        return check_text(value, path)
    if value is None or kind is bool or kind is int:
        return value  # type: ignore[no-any-return]
    if kind is float:
        if math.isfinite(value):
            return value  # type: ignore[no-any-return]
        raise InvalidPayloadError(f"{value!r} is not a valid JSON number", path=path)
    if depth >= MAX_DEPTH:
        raise InvalidPayloadError(f"nested deeper than {MAX_DEPTH} levels (a reference cycle?)", path=path)
    if isinstance(value, Mapping):
        result: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayloadError(
                    f"a mapping key is a {type(key).__name__}; JSON object keys must be strings",
                    path=path,
                )
            result[check_text(key, f"{path}[{key!r}]")] = to_json_value(item, f"{path}[{key!r}]", depth + 1)
        return result
    if isinstance(value, list | tuple):
        return [to_json_value(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    if isinstance(value, Enum):
        return to_json_value(value.value, path, depth + 1)
    if isinstance(value, str):
        return check_text(value, path)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return to_json_value(float(value), path, depth)
    raise InvalidPayloadError(f"a {kind.__module__}.{kind.__qualname__} is not JSON-serialisable", path=path)


def to_json_object(value: Any, path: str = "") -> JSONObject:
    """Like :func:`to_json_value`, but the top level must be a mapping."""
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"expected a mapping, got {type(value).__name__}", path=path)
    result = to_json_value(value, path)
    assert isinstance(result, dict)
    return result
