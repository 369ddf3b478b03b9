"""How the Redis store encodes what it stores: JSON text from :mod:`guarded.codec` (which refuses
NaN and infinities, lone surrogates and what JSON cannot carry, naming the path; its argument checks
are :mod:`guarded.codec`'s too), no larger than the store's ``max_value_bytes``; times."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from guarded.codec import JSONObject, compact_json, item_arguments, to_json_object
from guarded.errors import InvalidPayloadError

Item = TypeVar("Item")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def dumps(value: Any, limit: int, path: str = "") -> str:
    """The JSON text of an already encoded (plain) value, refused when larger than ``limit`` bytes."""
    return within(compact_json(value), limit, path)


def within(encoded: str, limit: int, path: str = "") -> str:
    """The JSON text ``encoded``, refused when larger than ``limit`` bytes."""
    if len(encoded) > limit // 4 and len(encoded.encode("utf-8")) > limit:
        raise InvalidPayloadError(
            f"the value's JSON text is larger than the store's max_value_bytes ({limit} bytes)", path=path
        )
    return encoded


def object_text(value: Any, limit: int, path: str) -> str:
    """The JSON text of the JSON object ``value`` (checked by :func:`guarded.codec.to_json_object`)."""
    try:
        plain = to_json_object(value)
    except InvalidPayloadError as exc:
        raise exc.at(path) from None
    except RecursionError:
        raise InvalidPayloadError("nested too deeply (a reference cycle?)", path=path) from None
    return dumps(plain, limit, path)


def record_text(encode: Callable[[], JSONObject], limit: int, path: str) -> tuple[JSONObject, str]:
    """A record encoded by a :mod:`guarded.codec` codec, and its JSON text."""
    try:
        doc = encode()
    except InvalidPayloadError as exc:
        raise exc.at(path) from None
    return doc, dumps(doc, limit, path)


def micros(moment: datetime) -> int:
    """Microseconds since the epoch of ``moment`` (a naive one read as UTC), exactly."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _ONE_MICROSECOND


_ONE_MICROSECOND = datetime.resolution


def items_of(
    method: str, items: Sequence[Any], arity: int, shape: str, name: str = "items"
) -> list[tuple[Any, ...]]:
    """The argument tuples of a bulk call's items, refusing an item of another shape."""
    calls: list[tuple[Any, ...]] = []
    for index, item in enumerate(items):
        if arity == 1:
            calls.append((item,))
            continue
        try:
            calls.append(item_arguments(item, arity, shape))
        except InvalidPayloadError as exc:
            raise exc.at(f"{name}[{index}]").for_method(method) from None
    return calls


def grouped(items: Sequence[Item], key: Callable[[Item], Hashable]) -> list[list[Item]]:
    """``items`` in groups of one key each (a hash tag: one slot), each group in list order."""
    groups: dict[Hashable, list[Item]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


def decoded(value: Any) -> str:
    """A reply as text (a client may or may not decode responses)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


__all__ = [
    "decoded",
    "dumps",
    "grouped",
    "items_of",
    "micros",
    "object_text",
    "record_text",
    "within",
]
