"""Store write calls as JSON and back, losslessly, in their original shape.

``encode_call("save_task", (state,), {})`` returns ``{"args": [...], "kwargs": {...}}`` where
every argument is encoded by the kind its parameter has in :data:`CALL_SPECS` (records through
:mod:`guarded.codec`, trajectories through their envelope, ids as strict strings).
:func:`decode_call` rebuilds ``(args, kwargs)`` so a replay runs
``getattr(store, method)(*args, **kwargs)`` exactly as the caller did. Arguments of methods or
parameters the table does not know must be plain JSON. Anything that cannot be carried raises
:class:`~guarded.errors.InvalidPayloadError` naming the method and the argument path, never the
value.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..codec import (
    ARTIFACT_SCOPE,
    DEFAULT_TYPES,
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    JSONObject,
    JSONValue,
    RecordCodec,
    RecordTypes,
    check_text,
    decode_trajectory,
    encode_trajectory,
    to_json_object,
    to_json_value,
)
from ..codec.records import JSON, OPT_TEXT, TEXT, FieldKind, nested, optional
from ..errors import InvalidPayloadError
from ..protocol import LEGACY_ALIASES
from ..steering import sanitize_steering_event

ARGS = "args"
KWARGS = "kwargs"


def _record(codec: RecordCodec[Any]) -> FieldKind:
    return FieldKind(codec.encode, lambda value, types, path: codec.decode(value, types, path))


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray | Mapping)


def _list_of(item: FieldKind, description: str) -> FieldKind:
    def encode(value: Any, path: str) -> JSONValue:
        if not _is_sequence(value):
            raise InvalidPayloadError(
                f"expected a list of {description}, got {type(value).__name__}", path=path
            )
        return [item.encode(element, f"{path}[{index}]") for index, element in enumerate(value)]

    def decode(value: Any, types: RecordTypes, path: str) -> Any:
        if not isinstance(value, list):
            raise InvalidPayloadError(f"expected a stored list of {description}", path=path)
        return [item.decode(element, types, f"{path}[{index}]") for index, element in enumerate(value)]

    return FieldKind(encode, decode)


def _pair(first: FieldKind, second: FieldKind, description: str) -> FieldKind:
    def encode(value: Any, path: str) -> JSONValue:
        if not _is_sequence(value) or len(value) != 2:
            raise InvalidPayloadError(f"expected a pair {description}", path=path)
        return [first.encode(value[0], f"{path}[0]"), second.encode(value[1], f"{path}[1]")]

    def decode(value: Any, types: RecordTypes, path: str) -> Any:
        if not isinstance(value, list) or len(value) != 2:
            raise InvalidPayloadError(f"expected a stored pair {description}", path=path)
        return (first.decode(value[0], types, f"{path}[0]"), second.decode(value[1], types, f"{path}[1]"))

    return FieldKind(encode, decode)


def _decode_object(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, dict):
        raise InvalidPayloadError("expected a stored JSON object", path=path)
    return value


def _encode_trajectory(value: Any, path: str) -> JSONValue:
    return encode_trajectory(value, path)


def _decode_trajectory(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise InvalidPayloadError("expected a stored trajectory envelope", path=path)
    return decode_trajectory(value)


def _encode_steering(value: Any, path: str) -> JSONValue:
    """Encode the event as given; if it cannot be stored, its sanitized form (what every store
    persists anyway, see :mod:`guarded.steering`)."""
    try:
        return STEERING_EVENT.encode(value, path)
    except InvalidPayloadError:
        try:
            sanitized = sanitize_steering_event(value)
        except Exception:
            sanitized = None
        if sanitized is None:
            raise
        return STEERING_EVENT.encode(sanitized, path)


def _encode_bytes(value: Any, path: str) -> JSONValue:
    """Binary data as standard base64 with padding (JSON has no bytes)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidPayloadError(f"expected bytes, got {type(value).__name__}", path=path)
    return base64.b64encode(value).decode("ascii")


def _decode_bytes(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, str):
        raise InvalidPayloadError("expected stored base64 text", path=path)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidPayloadError("stored bytes are not valid base64", path=path) from None


JSON_OBJECT_ARG = FieldKind(to_json_object, _decode_object)
BYTES = FieldKind(_encode_bytes, _decode_bytes)
"""``bytes`` (``bytearray`` and ``memoryview`` accepted), stored as base64; decodes to ``bytes``."""
TRAJECTORY = FieldKind(_encode_trajectory, _decode_trajectory)
STORED_EVENT_ARG = _record(STORED_EVENT)
STATE_UPDATE_ARG = _record(STATE_UPDATE)
PLANNER_EVENT_ARG = _record(PLANNER_EVENT)
STEERING_EVENT_ARG = FieldKind(_encode_steering, STEERING_EVENT.decode)


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a store method: its name, how its value is encoded, and whether it can
    only be passed by keyword."""

    name: str
    kind: FieldKind
    keyword_only: bool = False


@dataclass(frozen=True, slots=True)
class CallSpec:
    """The parameters of one write method, in signature order."""

    params: tuple[Param, ...]

    def positional(self, index: int) -> Param | None:
        """The parameter an argument at ``index`` binds to, or ``None``."""
        if index < len(self.params) and not self.params[index].keyword_only:
            return self.params[index]
        return None

    def keyword(self, name: str) -> Param | None:
        """The parameter named ``name``, or ``None``."""
        for param in self.params:
            if param.name == name:
                return param
        return None


def _spec(*params: Param) -> CallSpec:
    return CallSpec(params)


def _artifact_put(first: Param) -> CallSpec:
    """``ArtifactStore.put_bytes`` / ``put_text``: the content, then keyword-only metadata."""
    return _spec(
        first,
        Param("mime_type", OPT_TEXT, keyword_only=True),
        Param("filename", OPT_TEXT, keyword_only=True),
        Param("namespace", OPT_TEXT, keyword_only=True),
        Param("scope", optional(nested(ARTIFACT_SCOPE)), keyword_only=True),
        Param("meta", optional(JSON_OBJECT_ARG), keyword_only=True),
    )


CALL_SPECS: dict[str, CallSpec] = {
    "save_event": _spec(Param("event", STORED_EVENT_ARG)),
    "save_events": _spec(Param("events", _list_of(STORED_EVENT_ARG, "StoredEvent"))),
    "save_planner_state": _spec(Param("token", TEXT), Param("payload", JSON_OBJECT_ARG)),
    "save_memory_state": _spec(Param("key", TEXT), Param("state", JSON_OBJECT_ARG)),
    "save_task": _spec(Param("state", _record(TASK_STATE))),
    "save_update": _spec(Param("update", STATE_UPDATE_ARG)),
    "save_updates": _spec(Param("updates", _list_of(STATE_UPDATE_ARG, "StateUpdate"))),
    "save_steering": _spec(Param("event", STEERING_EVENT_ARG)),
    "save_trajectory": _spec(
        Param("trace_id", TEXT), Param("session_id", TEXT), Param("trajectory", TRAJECTORY)
    ),
    "save_planner_event": _spec(Param("trace_id", TEXT), Param("event", PLANNER_EVENT_ARG)),
    "save_planner_events": _spec(
        Param("items", _list_of(_pair(TEXT, PLANNER_EVENT_ARG, "(trace_id, PlannerEvent)"), "pairs"))
    ),
    "save_remote_binding": _spec(Param("binding", _record(REMOTE_BINDING))),
    "mark_binding_terminal": _spec(
        Param("trace_id", TEXT, keyword_only=True),
        Param("context_id", OPT_TEXT, keyword_only=True),
        Param("task_id", TEXT, keyword_only=True),
    ),
    # ArtifactStore writes (a guarded store's ``artifact_store``; held in a spill file of their own).
    "put_bytes": _artifact_put(Param("data", BYTES)),
    "put_text": _artifact_put(Param("text", TEXT)),
}
"""Argument specs of the known write methods (``guarded.protocol``, the Postgres backend, and the
``ArtifactStore`` puts)."""

CALL_ALIASES: dict[str, str] = {
    alias: target for alias, target in LEGACY_ALIASES.items() if target in CALL_SPECS
}
"""Legacy write methods (``save_task_update``) encoded like their targets."""


def spec_for(method: str) -> CallSpec | None:
    """The argument spec of ``method`` (legacy aliases resolved), or ``None`` for an unknown method."""
    return CALL_SPECS.get(CALL_ALIASES.get(method, method))


def _encode_value(param: Param | None, value: Any, path: str) -> JSONValue:
    try:
        return to_json_value(value, path) if param is None else param.kind.encode(value, path)
    except InvalidPayloadError:
        raise
    except RecursionError:
        raise InvalidPayloadError("nested too deeply to encode", path=path) from None
    except Exception as exc:
        raise InvalidPayloadError(f"cannot be encoded ({type(exc).__name__})", path=path) from None


def encode_call(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> JSONObject:
    """The JSON form of ``method(*args, **kwargs)``; raises :class:`InvalidPayloadError` for values
    that cannot be stored (the message names the method and the argument path, not the value)."""
    spec = spec_for(method)
    try:
        encoded_args: list[JSONValue] = []
        for index, value in enumerate(args):
            param = spec.positional(index) if spec is not None else None
            encoded_args.append(_encode_value(param, value, param.name if param else f"args[{index}]"))
        encoded_kwargs: JSONObject = {}
        for name, value in kwargs.items():
            if not isinstance(name, str):
                raise InvalidPayloadError("keyword argument names must be strings", path="kwargs")
            param = spec.keyword(name) if spec is not None else None
            encoded_kwargs[check_text(name, "kwargs")] = _encode_value(param, value, name)
    except InvalidPayloadError as exc:
        raise exc.for_method(method) from None
    return {ARGS: encoded_args, KWARGS: encoded_kwargs}


def decode_call(
    method: str, data: Mapping[str, Any], types: RecordTypes = DEFAULT_TYPES
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Rebuild ``(args, kwargs)`` from :func:`encode_call`'s output; records come back as classes
    of ``types``. Raises :class:`InvalidPayloadError` when ``data`` is not such an output."""
    spec = spec_for(method)
    try:
        raw_args = data.get(ARGS) if isinstance(data, Mapping) else None
        raw_kwargs = data.get(KWARGS) if isinstance(data, Mapping) else None
        if not isinstance(raw_args, list) or not isinstance(raw_kwargs, Mapping):
            raise InvalidPayloadError("not an encoded call (expected 'args' and 'kwargs')")
        args: list[Any] = []
        for index, value in enumerate(raw_args):
            param = spec.positional(index) if spec is not None else None
            kind = param.kind if param is not None else JSON
            args.append(kind.decode(value, types, param.name if param else f"args[{index}]"))
        kwargs: dict[str, Any] = {}
        for name, value in raw_kwargs.items():
            param = spec.keyword(name) if spec is not None else None
            kind = param.kind if param is not None else JSON
            kwargs[name] = kind.decode(value, types, name)
    except InvalidPayloadError as exc:
        raise exc.for_method(method) from None
    except Exception as exc:
        raise InvalidPayloadError(f"stored call cannot be decoded ({type(exc).__name__})").for_method(
            method
        ) from None
    return tuple(args), kwargs


__all__ = [
    "CALL_ALIASES",
    "CALL_SPECS",
    "CallSpec",
    "Param",
    "decode_call",
    "encode_call",
    "spec_for",
]
