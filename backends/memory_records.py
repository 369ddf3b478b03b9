"""How the in-memory store keeps records: as JSON text encoded with :mod:`guarded.codec`, refused
with the method and argument named when JSON cannot carry them; the identity of an event; the
stored form of a remote binding."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from guarded.codec import STORED_EVENT, JSONObject, event_fingerprint, item_arguments, to_json_object
from guarded.errors import InvalidPayloadError
from guarded.models import GLOBAL_TRACE_ID, StoredEvent

BindingKey = tuple[str, str | None, str]
"""``(trace_id, context_id, task_id)``."""
Coordinates = tuple[str | None, str, str | None, str | None, str | None]
"""``(router_session_id, agent_url, remote_skill, tenant_id, user_id)``."""


def dumps(value: JSONObject) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def checked(method: str, argument: str, encode: Callable[[], JSONObject]) -> JSONObject:
    """Run a codec, naming ``method`` and the ``argument`` in any :class:`InvalidPayloadError`."""
    try:
        return encode()
    except InvalidPayloadError as exc:
        raise exc.at(argument).for_method(method) from None


def bulk_calls(
    method: str, items: Sequence[Any], arity: int, shape: str
) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(index, arguments)`` of each item of a bulk call, refusing an item of another shape."""
    for index, item in enumerate(items):
        try:
            arguments = item_arguments(item, arity, shape)
        except InvalidPayloadError as exc:
            raise exc.at(f"items[{index}]").for_method(method) from None
        yield index, arguments


def object_text(method: str, argument: str, value: Any) -> str:
    """The JSON text of the JSON object ``value``, refused as :func:`checked` does."""
    return dumps(checked(method, argument, partial(to_json_object, value)))


def text_of(data: JSONObject, key: str) -> str:
    return cast(str, data[key])


def ts_of(event: JSONObject) -> float:
    return float(cast(float, event["ts"]))


def encode_event(event: StoredEvent, method: str, argument: str) -> JSONObject:
    """The encoded event with ``trace_id`` normalised to :data:`GLOBAL_TRACE_ID` when missing."""
    data = checked(method, argument, lambda: STORED_EVENT.encode(event))
    data["trace_id"] = data["trace_id"] or GLOBAL_TRACE_ID
    return data


@dataclass(slots=True)
class Binding:
    seq: int
    text: str
    coordinates: Coordinates
    router_session_id: str | None
    is_terminal: bool

    @classmethod
    def of(cls, seq: int, data: JSONObject) -> Binding:
        router_session_id = cast(str | None, data["router_session_id"])
        coordinates = cast(
            Coordinates,
            (
                router_session_id,
                *(data[name] for name in ("agent_url", "remote_skill", "tenant_id", "user_id")),
            ),
        )
        return cls(seq, dumps(data), coordinates, router_session_id, bool(data["is_terminal"]))


__all__ = [
    "Binding",
    "BindingKey",
    "Coordinates",
    "bulk_calls",
    "checked",
    "dumps",
    "encode_event",
    "event_fingerprint",
    "object_text",
    "text_of",
    "ts_of",
]
