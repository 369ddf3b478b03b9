"""Lossless JSON codecs for every record type of the protocol.

Encoding reads attributes by name, so PenguiFlow's own objects (same attribute names) encode
exactly like ours. Decoding builds the classes of a :class:`RecordTypes` family: ours by
default, or any family with the same constructors (for example PenguiFlow's).
Datetimes become ISO 8601 strings (offset kept, naive stays naive), enums their values,
nested models nested objects, ``Any`` payloads strict JSON (see :mod:`.json_values`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Generic, TypeVar

from .. import models
from ..errors import InvalidPayloadError
from .json_values import (
    JSONObject,
    JSONValue,
    NotPlain,
    check_text,
    plain_copy,
    to_json_object,
    to_json_value,
)

T = TypeVar("T")

_MISSING = object()


@dataclass(frozen=True, slots=True)
class RecordTypes:
    """The classes :meth:`RecordCodec.decode` builds, one per record type."""

    StoredEvent: type[Any] = models.StoredEvent
    RemoteBinding: type[Any] = models.RemoteBinding
    TaskContextSnapshot: type[Any] = models.TaskContextSnapshot
    TaskState: type[Any] = models.TaskState
    StateUpdate: type[Any] = models.StateUpdate
    SteeringEvent: type[Any] = models.SteeringEvent
    PlannerEvent: type[Any] = models.PlannerEvent
    TaskTelemetryEvent: type[Any] = models.TaskTelemetryEvent
    ArtifactScope: type[Any] = models.ArtifactScope
    ArtifactRef: type[Any] = models.ArtifactRef
    ArtifactRetentionConfig: type[Any] = models.ArtifactRetentionConfig
    TaskStatus: type[Enum] = models.TaskStatus
    TaskType: type[Enum] = models.TaskType
    UpdateType: type[Enum] = models.UpdateType
    SteeringEventType: type[Enum] = models.SteeringEventType


DEFAULT_TYPES = RecordTypes()


def penguiflow_types() -> RecordTypes:
    """The family of PenguiFlow's own classes, for code that wants them back from a store.

    Raises ``ImportError`` when ``penguiflow`` is not installed.
    """
    from penguiflow.artifacts import ArtifactRef, ArtifactRetentionConfig, ArtifactScope
    from penguiflow.planner import PlannerEvent
    from penguiflow.sessions.telemetry import TaskTelemetryEvent
    from penguiflow.state import models as pf

    return RecordTypes(
        StoredEvent=pf.StoredEvent,
        RemoteBinding=pf.RemoteBinding,
        TaskContextSnapshot=pf.TaskContextSnapshot,
        TaskState=pf.TaskState,
        StateUpdate=pf.StateUpdate,
        SteeringEvent=pf.SteeringEvent,
        PlannerEvent=PlannerEvent,
        TaskTelemetryEvent=TaskTelemetryEvent,
        ArtifactScope=ArtifactScope,
        ArtifactRef=ArtifactRef,
        ArtifactRetentionConfig=ArtifactRetentionConfig,
        TaskStatus=pf.TaskStatus,
        TaskType=pf.TaskType,
        UpdateType=pf.UpdateType,
        SteeringEventType=pf.SteeringEventType,
    )


@functools.cache
def installed_types() -> RecordTypes:
    """PenguiFlow's classes (:func:`penguiflow_types`) when ``penguiflow`` is installed, else
    guarded's models (:data:`DEFAULT_TYPES`): what the backends return unless told otherwise, so
    PenguiFlow gets its own types back wherever it revalidates them."""
    try:
        return penguiflow_types()
    except ImportError:
        return DEFAULT_TYPES


def record_types_of(store: object) -> RecordTypes:
    """The classes ``store`` returns from reads (its ``types`` attribute), else :func:`installed_types`."""
    types = getattr(store, "types", None)
    return types if isinstance(types, RecordTypes) else installed_types()


# --- field kinds -----------------------------------------------------------------------------------
# Each kind is a pair of checked functions, encode(value, path) -> JSON and decode(json, types, path)
# -> value, which name the path of what they refuse, and usually a pair of quick ones without a path
# that take the common values only (exact types, ASCII or valid text, no exotic numbers) and raise
# NotPlain for any other; the codec then runs the checked functions, so a quick function never
# changes a result or an error, it only skips building paths and the checks a plain value passes.


@dataclass(frozen=True, slots=True)
class FieldKind:
    encode: Callable[[Any, str], JSONValue]
    decode: Callable[[Any, RecordTypes, str], Any]
    quick_encode: Callable[[Any], JSONValue] | None = None
    """``encode`` of the values it takes without a path; :class:`NotPlain` for any other."""
    quick_decode: Callable[[Any, RecordTypes], Any] | None = None
    """``decode`` of the values it takes without a path; :class:`NotPlain` for any other."""


def _fail(path: str, expected: str, value: Any) -> InvalidPayloadError:
    return InvalidPayloadError(f"expected {expected}, got {type(value).__name__}", path=path)


_QUICK_INT_LIMIT = 2**64
"""Integers of smaller magnitude are written as JSON and fit a float: the quick forms take them."""


def _encode_text(value: Any, path: str) -> JSONValue:
    if not isinstance(value, str):
        raise _fail(path, "a string", value)
    return check_text(value, path)


def _quick_encode_text(value: Any) -> JSONValue:
    if type(value) is str:
        if value.isascii():
            return value
        try:
            value.encode("utf-8")  # lone surrogates: the checked path names them
        except UnicodeEncodeError:
            raise NotPlain from None
        return value
    raise NotPlain


def _encode_int(value: Any, path: str) -> JSONValue:
    # A boolean is stored as 0 or 1: PenguiFlow's models take one for an integer (pydantic's lax
    # mode) and its sessions set one (``steer(PRIORITIZE, {"priority": True})``), and PenguiFlow's
    # reference store keeps it; refusing it would park the task.
    if not isinstance(value, int):
        raise _fail(path, "an integer", value)
    return to_json_value(int(value), path)  # refuses one beyond the digit limit


def _quick_encode_int(value: Any) -> JSONValue:
    if type(value) is int and -_QUICK_INT_LIMIT < value < _QUICK_INT_LIMIT:
        return value
    raise NotPlain


def _encode_number(value: Any, path: str) -> JSONValue:
    if isinstance(value, bool):
        return int(value)  # as for an integer (above)
    if not isinstance(value, int | float):
        raise _fail(path, "a number", value)
    if isinstance(value, float):
        return to_json_value(float(value), path)
    try:
        float(value)  # a number field is a float: an integer must fit one
    except OverflowError:
        raise InvalidPayloadError("an integer too large for a floating-point number", path=path) from None
    return to_json_value(int(value), path)


def _quick_encode_number(value: Any) -> JSONValue:
    kind = type(value)
    if (kind is float and value - value == 0.0) or (  # finite: inf - inf and nan - nan are nan
        kind is int and -_QUICK_INT_LIMIT < value < _QUICK_INT_LIMIT
    ):
        return value  # type: ignore[no-any-return]
    raise NotPlain


def _encode_bool(value: Any, path: str) -> JSONValue:
    if not isinstance(value, bool):
        raise _fail(path, "a boolean", value)
    return value


def _quick_encode_bool(value: Any) -> JSONValue:
    if type(value) is bool:
        return value
    raise NotPlain


def _encode_datetime(value: Any, path: str) -> JSONValue:
    if not isinstance(value, datetime):
        raise _fail(path, "a datetime", value)
    return value.isoformat()


def _quick_encode_datetime(value: Any) -> JSONValue:
    if type(value) is datetime:
        return value.isoformat()
    raise NotPlain


def _quick_encode_json(value: Any) -> JSONValue:
    return plain_copy(value, 0)


def _quick_encode_json_object(value: Any) -> JSONValue:
    if type(value) is dict:
        return plain_copy(value, 0)
    raise NotPlain


def _decode_datetime(value: Any, types: RecordTypes, path: str) -> datetime:
    if not isinstance(value, str):
        raise _fail(path, "an ISO 8601 string", value)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise _fail(path, "an ISO 8601 string", value) from None


def _quick_decode_datetime(value: Any, types: RecordTypes) -> datetime:
    if type(value) is str:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    raise NotPlain


def _same(value: Any, types: RecordTypes, path: str) -> Any:
    return value


def _quick_same(value: Any, types: RecordTypes) -> Any:
    return value


def _decode_text(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, str):
        raise _fail(path, "a string", value)
    return value


def _quick_decode_text(value: Any, types: RecordTypes) -> Any:
    if type(value) is str:
        return value
    raise NotPlain


def _decode_int(value: Any, types: RecordTypes, path: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, "an integer", value)
    return value


def _quick_decode_int(value: Any, types: RecordTypes) -> Any:
    if type(value) is int:
        return value
    raise NotPlain


def _decode_bool(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, bool):
        raise _fail(path, "a boolean", value)
    return value


def _quick_decode_bool(value: Any, types: RecordTypes) -> Any:
    if type(value) is bool:
        return value
    raise NotPlain


def _decode_json_object(value: Any, types: RecordTypes, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise _fail(path, "a JSON object", value)
    return dict(value)


def _quick_decode_json_object(value: Any, types: RecordTypes) -> Any:
    if type(value) is dict:
        return dict(value)
    raise NotPlain


def _decode_number(value: Any, types: RecordTypes, path: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, "a number", value)
    return value


def _quick_decode_number(value: Any, types: RecordTypes) -> Any:
    kind = type(value)
    if kind is float or kind is int:
        return value
    raise NotPlain


TEXT = FieldKind(_encode_text, _decode_text, _quick_encode_text, _quick_decode_text)
INT = FieldKind(_encode_int, _decode_int, _quick_encode_int, _quick_decode_int)
NUMBER = FieldKind(_encode_number, _decode_number, _quick_encode_number, _quick_decode_number)
BOOL = FieldKind(_encode_bool, _decode_bool, _quick_encode_bool, _quick_decode_bool)
DATETIME = FieldKind(_encode_datetime, _decode_datetime, _quick_encode_datetime, _quick_decode_datetime)
JSON = FieldKind(to_json_value, _same, _quick_encode_json, _quick_same)
JSON_OBJECT = FieldKind(
    to_json_object, _decode_json_object, _quick_encode_json_object, _quick_decode_json_object
)


def optional(kind: FieldKind) -> FieldKind:
    """``kind`` or ``None``."""
    quick_encode, quick_decode = kind.quick_encode, kind.quick_decode

    def quick_encode_optional(value: Any) -> JSONValue:
        return None if value is None else quick_encode(value)  # type: ignore[misc]

    def quick_decode_optional(value: Any, types: RecordTypes) -> Any:
        return None if value is None else quick_decode(value, types)  # type: ignore[misc]

    return FieldKind(
        lambda value, path: None if value is None else kind.encode(value, path),
        lambda value, types, path: None if value is None else kind.decode(value, types, path),
        None if quick_encode is None else quick_encode_optional,
        None if quick_decode is None else quick_decode_optional,
    )


def enum(family_name: str) -> FieldKind:
    """An enum of the family's class ``family_name``; encodes its value, accepts any enum or raw value."""
    members = {member.value: member.value for member in getattr(DEFAULT_TYPES, family_name)}
    expected = f"a {family_name} ({', '.join(sorted(members))})"

    def encode(value: Any, path: str) -> JSONValue:
        raw = value.value if isinstance(value, Enum) else value
        try:
            canonical = members.get(raw)
        except TypeError:  # unhashable (a list, a dict): certainly not a member
            canonical = None
        if canonical is None:
            raise _fail(path, expected, value)
        return canonical  # type: ignore[no-any-return]

    def quick_encode(value: Any) -> JSONValue:
        try:
            return members[value.value if isinstance(value, Enum) else value]  # type: ignore[no-any-return]
        except (KeyError, TypeError):
            raise NotPlain from None

    def decode(value: Any, types: RecordTypes, path: str) -> Any:
        try:
            return getattr(types, family_name)(value)
        except ValueError:
            raise _fail(path, f"a {family_name}", value) from None

    def quick_decode(value: Any, types: RecordTypes) -> Any:
        try:
            return _members_by_value(getattr(types, family_name))[value]
        except (KeyError, TypeError):  # not a member's value, or unhashable: ask the class
            raise NotPlain from None

    return FieldKind(encode, decode, quick_encode, quick_decode)


@functools.cache
def _members_by_value(enum_class: type[Enum]) -> dict[Any, Enum]:
    """The members of ``enum_class`` by value: what ``enum_class(value)`` returns for a member's value."""
    return {member.value: member for member in enum_class}


def nested(codec: RecordCodec[Any]) -> FieldKind:
    """A record of another codec, stored as a nested object."""
    return FieldKind(
        lambda value, path: codec.encode(value, path),
        lambda value, types, path: codec.decode(value, types, path),
        None if codec.quick_encoders is None else codec.quick_encode,
        None if codec.quick_decoders is None else codec.quick_decode,
    )


# --- record codecs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: FieldKind
    has_default: bool = False


_QuickEncoder = tuple[str, Callable[[Any], JSONValue]]
_QuickDecoder = tuple[str, Callable[[Any, RecordTypes], Any], bool]


class RecordCodec(Generic[T]):
    """Encodes one record type to a JSON object and decodes it back into a family class."""

    def __init__(self, name: str, *fields_: Field) -> None:
        self.name = name
        self.fields = fields_
        encoders = [
            (field.name, field.kind.quick_encode) for field in fields_ if field.kind.quick_encode is not None
        ]
        decoders = [
            (field.name, field.kind.quick_decode, field.has_default)
            for field in fields_
            if field.kind.quick_decode is not None
        ]
        self.quick_encoders: tuple[_QuickEncoder, ...] | None = (
            tuple(encoders) if len(encoders) == len(fields_) else None
        )
        """Each field's name and quick encoder, or ``None`` when a field has none."""
        self.quick_decoders: tuple[_QuickDecoder, ...] | None = (
            tuple(decoders) if len(decoders) == len(fields_) else None
        )
        """Each field's name, quick decoder and whether it has a default (``None``: a field has no
        quick decoder)."""

    def encode(self, record: Any, path: str = "") -> JSONObject:
        """Return the JSON object for ``record`` (ours, PenguiFlow's, or any object with the attributes)."""
        if self.quick_encoders is not None:
            try:
                return self.quick_encode(record)
            except (NotPlain, AttributeError, RecursionError):
                pass  # the checked path returns the same object, or the error naming the path
        result: JSONObject = {}
        for field in self.fields:
            value = getattr(record, field.name, _MISSING)
            where = f"{path}.{field.name}" if path else field.name
            if value is _MISSING:
                raise InvalidPayloadError(
                    f"{type(record).__name__} has no attribute {field.name!r}", path=where
                )
            result[field.name] = field.kind.encode(value, where)
        return result

    def quick_encode(self, record: Any) -> JSONObject:
        """:meth:`encode` of a record whose every field its quick encoder takes; raises
        :class:`NotPlain` (or ``AttributeError``, ``RecursionError``) for any other."""
        return {name: quick(getattr(record, name)) for name, quick in self.quick_encoders}  # type: ignore[union-attr]

    def decode(self, data: Mapping[str, Any], types: RecordTypes = DEFAULT_TYPES, path: str = "") -> T:
        """Rebuild the record from :meth:`encode`'s output as an instance of ``types``' class."""
        if self.quick_decoders is not None and type(data) is dict:
            try:
                kwargs = self._quick_arguments(data, types)
            except NotPlain:
                pass  # the checked path below names what is wrong
            else:
                return self._build(kwargs, types, path)
        if not isinstance(data, Mapping):
            raise _fail(path or self.name, f"a stored {self.name} object", data)
        kwargs = {}
        for field in self.fields:
            where = f"{path}.{field.name}" if path else field.name
            if field.name in data:
                kwargs[field.name] = field.kind.decode(data[field.name], types, where)
            elif not field.has_default:
                raise InvalidPayloadError(
                    f"stored {self.name} lacks required field {field.name!r}", path=where
                )
        return self._build(kwargs, types, path)

    def quick_decode(self, data: Any, types: RecordTypes) -> T:
        """:meth:`decode` of a stored object whose every field its quick decoder takes and that
        builds its class; raises :class:`NotPlain` for any other."""
        if type(data) is not dict:
            raise NotPlain
        try:
            return getattr(types, self.name)(**self._quick_arguments(data, types))  # type: ignore[no-any-return]
        except (TypeError, ValueError):
            raise NotPlain from None

    def _quick_arguments(self, data: dict[str, Any], types: RecordTypes) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for name, quick, has_default in self.quick_decoders:  # type: ignore[union-attr]
            if name in data:
                kwargs[name] = quick(data[name], types)
            elif not has_default:
                raise NotPlain
        return kwargs

    def _build(self, kwargs: dict[str, Any], types: RecordTypes, path: str) -> T:
        cls: type[T] = getattr(types, self.name)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise InvalidPayloadError(
                f"stored {self.name} does not build a {cls.__qualname__} ({_describe(exc)})", path=path
            ) from exc


def _describe(exc: Exception) -> str:
    """What a constructor refused, without the refused values or mapping keys (they may be payload
    contents): pydantic's error locations keep the field name and list indexes, and name any
    deeper mapping key or field by its position in the location only."""
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError
    if callable(errors):
        try:
            return "; ".join(f"{_location(error['loc'])}: {error['type']}" for error in errors())
        except (TypeError, KeyError):
            pass
    return type(exc).__name__


def _location(loc: Any) -> str:
    """``field[3][key (str)]`` for pydantic's ``("field", 3, "<a key>")``."""
    parts = list(loc) if isinstance(loc, tuple | list) else [loc]
    if not parts:
        return "(record)"
    head, rest = parts[0], parts[1:]
    text = head if isinstance(head, str) and head.isidentifier() else f"({type(head).__name__})"
    for part in rest:
        text += f"[{part}]" if type(part) is int else f"[key ({type(part).__name__})]"
    return text


def _f(name: str, kind: FieldKind, *, default: bool = False) -> Field:
    return Field(name, kind, default)


OPT_TEXT = optional(TEXT)
OPT_INT = optional(INT)
OPT_NUMBER = optional(NUMBER)

STORED_EVENT: RecordCodec[models.StoredEvent] = RecordCodec(
    "StoredEvent",
    _f("trace_id", OPT_TEXT),
    _f("ts", NUMBER),
    _f("kind", TEXT),
    _f("node_name", OPT_TEXT),
    _f("node_id", OPT_TEXT),
    _f("payload", JSON_OBJECT),
)

REMOTE_BINDING: RecordCodec[models.RemoteBinding] = RecordCodec(
    "RemoteBinding",
    _f("trace_id", TEXT),
    _f("context_id", OPT_TEXT),
    _f("task_id", TEXT),
    _f("agent_url", TEXT),
    _f("router_session_id", OPT_TEXT, default=True),
    _f("remote_skill", OPT_TEXT, default=True),
    _f("tenant_id", OPT_TEXT, default=True),
    _f("user_id", OPT_TEXT, default=True),
    _f("last_remote_task_id", OPT_TEXT, default=True),
    _f("is_terminal", BOOL, default=True),
    _f("metadata", JSON_OBJECT, default=True),
)

TASK_CONTEXT_SNAPSHOT: RecordCodec[models.TaskContextSnapshot] = RecordCodec(
    "TaskContextSnapshot",
    _f("session_id", TEXT),
    _f("task_id", TEXT),
    _f("trace_id", OPT_TEXT, default=True),
    _f("spawned_from_task_id", TEXT, default=True),
    _f("spawned_from_event_id", OPT_TEXT, default=True),
    _f("spawned_at", DATETIME, default=True),
    _f("spawn_reason", OPT_TEXT, default=True),
    _f("query", OPT_TEXT, default=True),
    _f("propagate_on_cancel", TEXT, default=True),
    _f("notify_on_complete", BOOL, default=True),
    _f("context_version", OPT_INT, default=True),
    _f("context_hash", OPT_TEXT, default=True),
    _f("llm_context", JSON_OBJECT, default=True),
    _f("tool_context", JSON_OBJECT, default=True),
    _f("memory", JSON_OBJECT, default=True),
    _f("artifacts", JSON, default=True),
)

TASK_STATE: RecordCodec[models.TaskState] = RecordCodec(
    "TaskState",
    _f("task_id", TEXT),
    _f("session_id", TEXT),
    _f("status", enum("TaskStatus")),
    _f("task_type", enum("TaskType")),
    _f("priority", INT),
    _f("context_snapshot", nested(TASK_CONTEXT_SNAPSHOT)),
    _f("trace_id", OPT_TEXT, default=True),
    _f("result", JSON, default=True),
    _f("error", OPT_TEXT, default=True),
    _f("description", OPT_TEXT, default=True),
    _f("progress", optional(JSON_OBJECT), default=True),
    _f("created_at", DATETIME, default=True),
    _f("updated_at", DATETIME, default=True),
)

STATE_UPDATE: RecordCodec[models.StateUpdate] = RecordCodec(
    "StateUpdate",
    _f("session_id", TEXT),
    _f("task_id", TEXT),
    _f("trace_id", OPT_TEXT, default=True),
    _f("update_id", TEXT),
    _f("update_type", enum("UpdateType")),
    _f("content", JSON),
    _f("step_index", OPT_INT, default=True),
    _f("total_steps", OPT_INT, default=True),
    _f("created_at", DATETIME, default=True),
)

STEERING_EVENT: RecordCodec[models.SteeringEvent] = RecordCodec(
    "SteeringEvent",
    _f("session_id", TEXT),
    _f("task_id", TEXT),
    _f("event_id", TEXT),
    _f("event_type", enum("SteeringEventType")),
    _f("payload", JSON_OBJECT, default=True),
    _f("trace_id", OPT_TEXT, default=True),
    _f("source", TEXT, default=True),
    _f("created_at", DATETIME, default=True),
)

PLANNER_EVENT: RecordCodec[models.PlannerEvent] = RecordCodec(
    "PlannerEvent",
    _f("event_type", TEXT),
    _f("ts", NUMBER),
    _f("trajectory_step", OPT_INT, default=True),
    _f("thought", OPT_TEXT, default=True),
    _f("node_name", OPT_TEXT, default=True),
    _f("latency_ms", OPT_NUMBER, default=True),
    _f("token_estimate", OPT_INT, default=True),
    _f("error", OPT_TEXT, default=True),
    _f("extra", JSON_OBJECT, default=True),
)

TASK_TELEMETRY_EVENT: RecordCodec[models.TaskTelemetryEvent] = RecordCodec(
    "TaskTelemetryEvent",
    _f("event_type", TEXT),
    _f("outcome", TEXT),
    _f("session_id", TEXT),
    _f("task_id", TEXT),
    _f("parent_task_id", OPT_TEXT, default=True),
    _f("trace_id", OPT_TEXT, default=True),
    _f("task_type", enum("TaskType")),
    _f("status", enum("TaskStatus")),
    _f("mode", OPT_TEXT, default=True),
    _f("spawn_reason", OPT_TEXT, default=True),
    _f("duration_ms", OPT_NUMBER, default=True),
    _f("created_at_s", NUMBER, default=True),
    _f("extra", JSON_OBJECT, default=True),
)

ARTIFACT_SCOPE: RecordCodec[models.ArtifactScope] = RecordCodec(
    "ArtifactScope",
    _f("tenant_id", OPT_TEXT, default=True),
    _f("user_id", OPT_TEXT, default=True),
    _f("session_id", OPT_TEXT, default=True),
    _f("trace_id", OPT_TEXT, default=True),
)

ARTIFACT_REF: RecordCodec[models.ArtifactRef] = RecordCodec(
    "ArtifactRef",
    _f("id", TEXT),
    _f("mime_type", OPT_TEXT, default=True),
    _f("size_bytes", OPT_INT, default=True),
    _f("filename", OPT_TEXT, default=True),
    _f("sha256", OPT_TEXT, default=True),
    _f("scope", optional(nested(ARTIFACT_SCOPE)), default=True),
    _f("namespace", OPT_TEXT, default=True),
    _f("source", JSON_OBJECT, default=True),
)

ARTIFACT_RETENTION_CONFIG: RecordCodec[models.ArtifactRetentionConfig] = RecordCodec(
    "ArtifactRetentionConfig",
    _f("ttl_seconds", INT, default=True),
    _f("max_artifact_bytes", INT, default=True),
    _f("max_session_bytes", INT, default=True),
    _f("max_trace_bytes", INT, default=True),
    _f("max_artifacts_per_trace", INT, default=True),
    _f("max_artifacts_per_session", INT, default=True),
    _f("cleanup_strategy", TEXT, default=True),
)

CODECS: dict[str, RecordCodec[Any]] = {
    codec.name: codec
    for codec in (
        STORED_EVENT,
        REMOTE_BINDING,
        TASK_CONTEXT_SNAPSHOT,
        TASK_STATE,
        STATE_UPDATE,
        STEERING_EVENT,
        PLANNER_EVENT,
        TASK_TELEMETRY_EVENT,
        ARTIFACT_SCOPE,
        ARTIFACT_REF,
        ARTIFACT_RETENTION_CONFIG,
    )
}


def codec_for(record: Any) -> RecordCodec[Any]:
    """The codec for ``record``, found by class name so PenguiFlow's classes map to the same codec."""
    try:
        return CODECS[type(record).__name__]
    except KeyError:
        raise InvalidPayloadError(f"no codec for {type(record).__qualname__}") from None


def encode(record: Any) -> JSONObject:
    """Encode any record of the protocol (ours or PenguiFlow's) to a JSON object."""
    return codec_for(record).encode(record)


def decode(name: str, data: Mapping[str, Any], types: RecordTypes = DEFAULT_TYPES) -> Any:
    """Decode a JSON object produced by :func:`encode` for the record type called ``name``."""
    return CODECS[name].decode(data, types)


__all__ = [
    "CODECS",
    "DEFAULT_TYPES",
    "RecordCodec",
    "RecordTypes",
    "codec_for",
    "decode",
    "encode",
    "penguiflow_types",
]
