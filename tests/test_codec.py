"""The JSON codec: every record round-trips exactly, and what JSON cannot carry is refused by path."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from guarded import models as m
from guarded.codec import (
    CODECS,
    DEFAULT_TYPES,
    RecordTypes,
    decode,
    decode_trajectory,
    encode,
    encode_trajectory,
    penguiflow_types,
    register_trajectory_type,
    to_json_value,
)
from guarded.errors import InvalidPayloadError

# --- sample values ------------------------------------------------------------------------------------

AWARE = datetime(2024, 5, 17, 13, 45, 12, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
AWARE_NEGATIVE = datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-3)))
AWARE_UTC = datetime(2025, 1, 1, tzinfo=UTC)
NAIVE = datetime(2023, 2, 3, 4, 5, 6, 7)
DATETIMES = [AWARE, AWARE_NEGATIVE, AWARE_UTC, NAIVE]


class Colour(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


NESTED: dict[str, Any] = {
    "text": "h\u00e9llo \u2603 \U0001f600",
    "nul": "a\x00b",
    "": "empty key",
    "small": -(2**63),
    "big": 2**70,
    "float": 1.5e-300,
    "true": True,
    "false": False,
    "none": None,
    "list": [1, [2.5, [3, {"deep": [], "deeper": {"x": "y"}}]]],
    "empty": {},
}


def sample_snapshot(t: RecordTypes) -> Any:
    return t.TaskContextSnapshot(
        session_id="session-\u00df",
        task_id="task-1",
        trace_id="trace-1",
        spawned_from_task_id="task-0",
        spawned_from_event_id="event-9",
        spawned_at=AWARE,
        spawn_reason="user asked for a report",
        query="summarise Q3",
        propagate_on_cancel="isolate",
        notify_on_complete=False,
        context_version=7,
        context_hash="ab" * 32,
        llm_context={"history": [{"role": "user", "content": "hi"}], "nested": NESTED},
        tool_context={"token_budget": 1200, "flags": [True, False]},
        memory={"summary": "earlier", "turns": 3},
        artifacts=[{"id": "a1", "mime": "text/plain"}, {"id": "a2", "size": 0}],
    )


def sample_stored_event(t: RecordTypes) -> Any:
    return t.StoredEvent(
        trace_id="trace-\x00nul",
        ts=1716000000.123456,
        kind="node_success",
        node_name="llm_node",
        node_id="llm_node_abc123",
        payload={"latency_ms": 1523.45, "attempt": 2, "flow_error": {"code": "E"}, "nested": NESTED},
    )


def sample_remote_binding(t: RecordTypes) -> Any:
    return t.RemoteBinding(
        trace_id="trace-1",
        context_id="ctx-1",
        task_id="a2a-task-1",
        agent_url="https://agent.example/a2a",
        router_session_id="router-session-1",
        remote_skill="search",
        tenant_id="tenant-1",
        user_id="user-1",
        last_remote_task_id="a2a-task-0",
        is_terminal=True,
        metadata={"turns": 4, "labels": ["x", "y"], "nested": NESTED},
    )


def sample_task_state(t: RecordTypes) -> Any:
    return t.TaskState(
        task_id="task-1",
        session_id="session-\u00df",
        status=t.TaskStatus.PAUSED,
        task_type=t.TaskType.BACKGROUND,
        priority=-5,
        context_snapshot=sample_snapshot(t),
        trace_id="trace-1",
        result={"answer": [1, 2, {"three": 3.0}], "nested": NESTED},
        error="partial failure",
        description="background report",
        progress={"step": 3, "of": 10},
        created_at=AWARE_NEGATIVE,
        updated_at=NAIVE,
    )


def sample_state_update(t: RecordTypes) -> Any:
    return t.StateUpdate(
        session_id="session-1",
        task_id="task-1",
        trace_id="trace-1",
        update_id="update-1",
        update_type=t.UpdateType.TOOL_CALL,
        content=[{"tool": "search", "args": {"q": "x"}}, "text", 3, None, NESTED],
        step_index=2,
        total_steps=9,
        created_at=AWARE,
    )


def sample_steering_event(t: RecordTypes) -> Any:
    return t.SteeringEvent(
        session_id="session-1",
        task_id="task-1",
        event_id="event-1",
        event_type=t.SteeringEventType.REDIRECT,
        payload={"instruction": "focus on EMEA", "nested": NESTED},
        trace_id="trace-1",
        source="agent",
        created_at=AWARE_UTC,
    )


def sample_planner_event(t: RecordTypes) -> Any:
    return t.PlannerEvent(
        event_type="llm_stream_chunk",
        ts=1716000001.5,
        trajectory_step=4,
        thought="need more data",
        node_name="search",
        latency_ms=12.25,
        token_estimate=345,
        error="rate limited",
        extra={"text": "chunk", "done": False, "nested": NESTED},
    )


def sample_telemetry_event(t: RecordTypes) -> Any:
    return t.TaskTelemetryEvent(
        event_type="task_failed",
        outcome="failed",
        session_id="session-1",
        task_id="task-1",
        parent_task_id="task-0",
        trace_id="trace-1",
        task_type=t.TaskType.BACKGROUND,
        status=t.TaskStatus.FAILED,
        mode="subagent",
        spawn_reason="parallel research",
        duration_ms=812.5,
        created_at_s=1716000002.25,
        extra={"retries": 2, "nested": NESTED},
    )


def sample_scope(t: RecordTypes) -> Any:
    return t.ArtifactScope(tenant_id="tenant-1", user_id="user-1", session_id="session-1", trace_id="trace-1")


def sample_artifact_ref(t: RecordTypes) -> Any:
    return t.ArtifactRef(
        id="tool_0123456789ab",
        mime_type="application/pdf",
        size_bytes=123456,
        filename="report.pdf",
        sha256="cd" * 32,
        scope=sample_scope(t),
        namespace="tool",
        source={"tool": "pdf_export", "warnings": ["truncated"], "nested": NESTED},
    )


def sample_retention(t: RecordTypes) -> Any:
    return t.ArtifactRetentionConfig(
        ttl_seconds=60,
        max_artifact_bytes=1,
        max_session_bytes=2,
        max_trace_bytes=3,
        max_artifacts_per_trace=4,
        max_artifacts_per_session=5,
        cleanup_strategy="fifo",
    )


SAMPLES: dict[str, Callable[[RecordTypes], Any]] = {
    "StoredEvent": sample_stored_event,
    "RemoteBinding": sample_remote_binding,
    "TaskContextSnapshot": sample_snapshot,
    "TaskState": sample_task_state,
    "StateUpdate": sample_state_update,
    "SteeringEvent": sample_steering_event,
    "PlannerEvent": sample_planner_event,
    "TaskTelemetryEvent": sample_telemetry_event,
    "ArtifactScope": sample_scope,
    "ArtifactRef": sample_artifact_ref,
    "ArtifactRetentionConfig": sample_retention,
}

RECORD_NAMES = sorted(SAMPLES)


def model_fields(cls: type[Any]) -> list[str]:
    """Field names of a dataclass or pydantic model, in declaration order."""
    if dataclasses.is_dataclass(cls):
        return [field.name for field in dataclasses.fields(cls)]
    assert issubclass(cls, BaseModel), cls
    return list(cls.model_fields)


def model_defaults(cls: type[Any]) -> dict[str, Any]:
    """The default of every field that has one (factories called)."""
    defaults: dict[str, Any] = {}
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                defaults[field.name] = field.default
            elif field.default_factory is not dataclasses.MISSING:
                defaults[field.name] = field.default_factory()
        return defaults
    for name, info in cls.model_fields.items():
        if not info.is_required():
            defaults[name] = info.get_default(call_default_factory=True)
    return defaults


def roundtrip(name: str, record: Any, types: RecordTypes = DEFAULT_TYPES) -> tuple[dict[str, Any], Any]:
    """Encode, prove the encoding is plain JSON, decode; return both."""
    encoded = encode(record)
    assert json.loads(json.dumps(encoded, allow_nan=False)) == encoded
    decoded = decode(name, json.loads(json.dumps(encoded)), types)
    return encoded, decoded


def refused(path: str, func: Callable[[], Any]) -> InvalidPayloadError:
    with pytest.raises(InvalidPayloadError) as info:
        func()
    assert info.value.path == path, str(info.value)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)
    return info.value


# --- field lists --------------------------------------------------------------------------------------


def test_every_record_type_has_a_codec_and_a_sample() -> None:
    families = [field.name for field in dataclasses.fields(RecordTypes)]
    records = [name for name in families if not issubclass(getattr(DEFAULT_TYPES, name), enum.Enum)]
    assert sorted(CODECS) == sorted(records) == RECORD_NAMES


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_codec_fields_equal_model_fields(name: str) -> None:
    """Adding a field to a model without adding it to its codec fails here."""
    codec = CODECS[name]
    cls = getattr(DEFAULT_TYPES, name)
    assert [field.name for field in codec.fields] == model_fields(cls)
    defaults = model_defaults(cls)
    for field in codec.fields:
        if field.has_default:
            assert field.name in defaults, f"{name}.{field.name} may be omitted but the model requires it"


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_samples_set_every_field_to_a_non_default(name: str) -> None:
    record = SAMPLES[name](DEFAULT_TYPES)
    for field, default in model_defaults(type(record)).items():
        assert getattr(record, field) != default, f"{name}.{field} keeps its default in the sample"


# --- round trips --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_roundtrip_every_record(name: str) -> None:
    record = SAMPLES[name](DEFAULT_TYPES)
    encoded, decoded = roundtrip(name, record)
    assert type(decoded) is type(record)
    assert decoded == record
    assert encode(decoded) == encoded
    assert list(encoded) == [field.name for field in CODECS[name].fields]


def test_encoding_shape() -> None:
    encoded = encode(sample_task_state(DEFAULT_TYPES))
    assert encoded["status"] == "PAUSED"
    assert encoded["task_type"] == "BACKGROUND"
    assert encoded["created_at"] == "1999-12-31T23:59:59.999999-03:00"
    assert encoded["updated_at"] == "2023-02-03T04:05:06.000007"
    snapshot = encoded["context_snapshot"]
    assert isinstance(snapshot, dict)
    assert snapshot["spawned_at"] == "2024-05-17T13:45:12.123456+05:30"


@pytest.mark.parametrize("moment", DATETIMES, ids=lambda moment: moment.isoformat())
def test_datetimes_keep_offset_or_naivety(moment: datetime) -> None:
    update = sample_state_update(DEFAULT_TYPES).model_copy(update={"created_at": moment})
    _, decoded = roundtrip("StateUpdate", update)
    assert decoded.created_at == moment
    assert decoded.created_at.utcoffset() == moment.utcoffset()
    assert (decoded.created_at.tzinfo is None) == (moment.tzinfo is None)

    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), created_at=moment, updated_at=moment)
    _, decoded_state = roundtrip("TaskState", state)
    assert decoded_state == state
    assert decoded_state.updated_at.utcoffset() == moment.utcoffset()


def test_global_event_and_optional_fields_none() -> None:
    event = dataclasses.replace(
        sample_stored_event(DEFAULT_TYPES), trace_id=None, node_name=None, node_id=None
    )
    assert roundtrip("StoredEvent", event)[1] == event
    binding = m.RemoteBinding(trace_id="t", context_id=None, task_id="k", agent_url="u")
    assert roundtrip("RemoteBinding", binding)[1] == binding
    ref = m.ArtifactRef(id="a", scope=None)
    assert roundtrip("ArtifactRef", ref)[1] == ref
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), result=None, progress=None)
    assert roundtrip("TaskState", state)[1] == state


def test_defaults_may_be_omitted_when_decoding() -> None:
    minimal = {"trace_id": "t", "context_id": None, "task_id": "k", "agent_url": "u"}
    assert decode("RemoteBinding", minimal) == m.RemoteBinding(**minimal)


@pytest.mark.parametrize("member", list(m.TaskStatus))
def test_every_task_status(member: m.TaskStatus) -> None:
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), status=member)
    encoded, decoded = roundtrip("TaskState", state)
    assert encoded["status"] == member.value
    assert decoded.status is member
    event = sample_telemetry_event(DEFAULT_TYPES).model_copy(update={"status": member})
    assert roundtrip("TaskTelemetryEvent", event)[1].status is member


@pytest.mark.parametrize("member", list(m.TaskType))
def test_every_task_type(member: m.TaskType) -> None:
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), task_type=member)
    assert roundtrip("TaskState", state)[1].task_type is member
    event = sample_telemetry_event(DEFAULT_TYPES).model_copy(update={"task_type": member})
    assert roundtrip("TaskTelemetryEvent", event)[1].task_type is member


@pytest.mark.parametrize("member", list(m.UpdateType))
def test_every_update_type(member: m.UpdateType) -> None:
    update = sample_state_update(DEFAULT_TYPES).model_copy(update={"update_type": member})
    encoded, decoded = roundtrip("StateUpdate", update)
    assert encoded["update_type"] == member.value
    assert decoded.update_type is member


@pytest.mark.parametrize("member", list(m.SteeringEventType))
def test_every_steering_event_type(member: m.SteeringEventType) -> None:
    event = sample_steering_event(DEFAULT_TYPES).model_copy(update={"event_type": member})
    encoded, decoded = roundtrip("SteeringEvent", event)
    assert encoded["event_type"] == member.value
    assert decoded.event_type is member


def test_every_literal_value() -> None:
    base = sample_telemetry_event(DEFAULT_TYPES)
    for event_type in get_args(m.TaskTelemetryEventType):
        event = base.model_copy(update={"event_type": event_type})
        assert roundtrip("TaskTelemetryEvent", event)[1] == event
    for outcome in get_args(m.TaskOutcome):
        event = base.model_copy(update={"outcome": outcome})
        assert roundtrip("TaskTelemetryEvent", event)[1] == event
    for mode in (*get_args(m.TaskMode), None):
        event = base.model_copy(update={"mode": mode})
        assert roundtrip("TaskTelemetryEvent", event)[1] == event
    for strategy in ("lru", "fifo", "none"):
        config = m.ArtifactRetentionConfig(cleanup_strategy=strategy)
        assert roundtrip("ArtifactRetentionConfig", config)[1] == config


# --- accepted values ----------------------------------------------------------------------------------


def test_nul_characters_are_accepted() -> None:
    event = dataclasses.replace(
        sample_stored_event(DEFAULT_TYPES), kind="k\x00", payload={"key\x00": "value\x00", "l": ["\x00"]}
    )
    encoded, decoded = roundtrip("StoredEvent", event)
    assert decoded == event
    assert encoded["payload"] == {"key\x00": "value\x00", "l": ["\x00"]}


def test_tuples_come_back_as_lists() -> None:
    event = dataclasses.replace(sample_stored_event(DEFAULT_TYPES), payload={"t": (1, (2, "x")), "l": [()]})
    encoded, decoded = roundtrip("StoredEvent", event)
    assert encoded["payload"] == {"t": [1, [2, "x"]], "l": [[]]}
    assert decoded.payload == {"t": [1, [2, "x"]], "l": [[]]}


def test_enum_values_inside_payloads_become_plain_values() -> None:
    payload = {"status": m.TaskStatus.RUNNING, Colour.RED: [Colour.RED], "level": Level.HIGH}
    event = dataclasses.replace(sample_stored_event(DEFAULT_TYPES), payload=payload)
    encoded, decoded = roundtrip("StoredEvent", event)
    assert encoded["payload"] == {"status": "RUNNING", "red": ["red"], "level": 3}
    stored = encoded["payload"]
    assert isinstance(stored, dict)
    assert type(stored["status"]) is str
    assert all(type(key) is str for key in stored)
    assert type(stored["level"]) is int
    assert decoded.payload == {"status": "RUNNING", "red": ["red"], "level": 3}


def test_enum_fields_accept_raw_values_and_other_families() -> None:
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), status="RUNNING")  # type: ignore[arg-type]
    assert encode(state)["status"] == "RUNNING"
    assert decode("TaskState", encode(state)).status is m.TaskStatus.RUNNING


def test_str_subclass_ids_are_stored_as_plain_strings() -> None:
    event = dataclasses.replace(sample_stored_event(DEFAULT_TYPES), kind=Colour.RED)
    encoded = encode(event)
    assert encoded["kind"] == "red"
    assert type(encoded["kind"]) is str


def test_integral_ts_is_kept() -> None:
    event = dataclasses.replace(sample_stored_event(DEFAULT_TYPES), ts=1716000000)
    encoded, decoded = roundtrip("StoredEvent", event)
    assert encoded["ts"] == 1716000000
    assert decoded == event


# --- refusals -----------------------------------------------------------------------------------------


def _event(**changes: Any) -> m.StoredEvent:
    return dataclasses.replace(sample_stored_event(DEFAULT_TYPES), **changes)


def test_nan_is_refused() -> None:
    refused("payload[key #0 (str)][1]", lambda: encode(_event(payload={"a": [1, math.nan]})))


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(value: float) -> None:
    refused("ts", lambda: encode(_event(ts=value)))
    refused("payload[key #0 (str)][key #0 (str)]", lambda: encode(_event(payload={"x": {"y": value}})))
    update = sample_state_update(DEFAULT_TYPES).model_copy(update={"content": [value]})
    refused("content[0]", lambda: encode(update))
    planner = dataclasses.replace(sample_planner_event(DEFAULT_TYPES), latency_ms=value)
    refused("latency_ms", lambda: encode(planner))


def test_lone_surrogate_in_value_is_refused() -> None:
    error = refused("payload[key #0 (str)]", lambda: encode(_event(payload={"text": "ok \ud800 not ok"})))
    assert "surrogate" in error.reason
    refused("kind", lambda: encode(_event(kind="\udfff")))
    binding = dataclasses.replace(sample_remote_binding(DEFAULT_TYPES), agent_url="http://\ud83d")
    refused("agent_url", lambda: encode(binding))


def test_lone_surrogate_in_key_is_refused() -> None:
    error = refused(
        "payload[key #0 (str)][key #0 (str)]", lambda: encode(_event(payload={"a": {"\ud800": 1}}))
    )
    assert "surrogate" in error.reason
    # The key is named by its position, never by its contents.
    error = refused(
        "payload[key #0 (str)][key #2 (str)]",
        lambda: encode(_event(payload={"a": {"x": 1, "y": 2, "ssn=078-05-1120 \ud800": 3}})),
    )
    assert "078-05-1120" not in str(error)


def test_non_string_key_is_refused() -> None:
    error = refused("payload[key #0 (str)][key #0 (int)]", lambda: encode(_event(payload={"a": {1: "x"}})))
    assert "int" in error.reason
    refused("payload[key #0 (NoneType)]", lambda: encode(_event(payload={None: "x"})))
    refused("payload[key #1 (tuple)]", lambda: encode(_event(payload={"ok": 1, (1, 2): "x"})))


@pytest.mark.parametrize(
    "bad",
    [datetime(2024, 1, 1), {1, 2}, frozenset(), object(), b"bytes", bytearray(b"x"), 1j, Exception("x")],
    ids=lambda value: type(value).__name__,
)
def test_non_json_values_inside_payloads_are_refused(bad: Any) -> None:
    error = refused("payload[key #0 (str)][0]", lambda: encode(_event(payload={"k": [bad]})))
    assert type(bad).__name__ in error.reason
    snapshot = sample_snapshot(DEFAULT_TYPES).model_copy(update={"llm_context": {"k": bad}})
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), context_snapshot=snapshot)
    refused("context_snapshot.llm_context[key #0 (str)]", lambda: encode(state))


def test_payload_must_be_a_mapping() -> None:
    refused("payload", lambda: encode(_event(payload=[("a", 1)])))


def test_missing_ids_are_refused() -> None:
    binding = dataclasses.replace(sample_remote_binding(DEFAULT_TYPES), trace_id=None)
    refused("trace_id", lambda: encode(binding))
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), task_id=None)
    refused("task_id", lambda: encode(state))
    snapshot = m.TaskContextSnapshot.model_construct(
        **{**dict(sample_snapshot(DEFAULT_TYPES)), "session_id": None}
    )
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), context_snapshot=snapshot)
    refused("context_snapshot.session_id", lambda: encode(state))
    update = m.StateUpdate.model_construct(**{**dict(sample_state_update(DEFAULT_TYPES)), "update_id": None})
    refused("update_id", lambda: encode(update))
    event = m.SteeringEvent.model_construct(
        **{**dict(sample_steering_event(DEFAULT_TYPES)), "session_id": None}
    )
    refused("session_id", lambda: encode(event))
    ref = m.ArtifactRef.model_construct(id=None)
    refused("id", lambda: encode(ref))


def test_missing_attribute_is_refused() -> None:
    class Half:
        trace_id = "t"

    Half.__name__ = "RemoteBinding"
    refused("context_id", lambda: encode(Half()))


def test_unknown_record_type_is_refused() -> None:
    with pytest.raises(InvalidPayloadError, match="no codec"):
        encode(object())


@pytest.mark.parametrize("bad", ["DONE", "pending", 1, None, ["PENDING"], {"v": "PENDING"}, True])
def test_wrong_enum_value_is_refused(bad: Any) -> None:
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), status=bad)
    error = refused("status", lambda: encode(state))
    assert "TaskStatus" in error.reason


def test_enum_of_another_family_with_a_foreign_value_is_refused() -> None:
    update = m.StateUpdate.model_construct(
        **{**dict(sample_state_update(DEFAULT_TYPES)), "update_type": m.SteeringEventType.PAUSE}
    )
    refused("update_type", lambda: encode(update))


def test_a_bool_where_a_number_is_expected_is_stored_as_0_or_1() -> None:
    """PenguiFlow's models take a boolean for an integer (pydantic's lax mode), its sessions set one
    (``steer(PRIORITIZE, {"priority": True})``) and its reference store keeps it: refusing it would
    park the task. It is stored as the integer it stands for."""
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), priority=True)
    assert encode(state)["priority"] == 1
    assert decode("TaskState", encode(state)).priority == 1
    ref = sample_artifact_ref(DEFAULT_TYPES).model_copy(update={"size_bytes": False})
    assert encode(ref)["size_bytes"] == 0
    planner = dataclasses.replace(sample_planner_event(DEFAULT_TYPES), ts=True)
    assert encode(planner)["ts"] == 1
    snapshot = sample_snapshot(DEFAULT_TYPES).model_copy(update={"context_version": True})
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), context_snapshot=snapshot)
    assert encode(state)["context_snapshot"]["context_version"] == 1
    refused("priority", lambda: encode(dataclasses.replace(state, priority="1")))


def test_wrong_scalar_types_are_refused() -> None:
    refused("kind", lambda: encode(_event(kind=3)))
    refused("ts", lambda: encode(_event(ts="1")))
    binding = dataclasses.replace(sample_remote_binding(DEFAULT_TYPES), is_terminal=1)
    refused("is_terminal", lambda: encode(binding))
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), created_at="2024-01-01")
    refused("created_at", lambda: encode(state))
    state = dataclasses.replace(sample_task_state(DEFAULT_TYPES), priority=1.0)
    refused("priority", lambda: encode(state))


def test_cyclic_payloads_are_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    error = refused_prefix("payload[key #0 (str)][key #0 (str)]", lambda: encode(_event(payload=loop)))
    assert "cycle" in error.reason
    chain: list[Any] = []
    chain.append(chain)
    refused_prefix("payload[key #0 (str)][0][0]", lambda: encode(_event(payload={"l": chain})))


def refused_prefix(prefix: str, func: Callable[[], Any]) -> InvalidPayloadError:
    with pytest.raises(InvalidPayloadError) as info:
        func()
    assert info.value.path.startswith(prefix), info.value.path
    return info.value


# --- decoding stored data that is not what encode wrote -----------------------------------------------


def test_decode_refuses_wrong_types() -> None:
    good = encode(sample_stored_event(DEFAULT_TYPES))
    refused("kind", lambda: decode("StoredEvent", {**good, "kind": 2}))
    refused("trace_id", lambda: decode("StoredEvent", {**good, "trace_id": ["t"]}))
    refused("payload", lambda: decode("StoredEvent", {**good, "payload": [["a", 1]]}))
    refused("ts", lambda: decode("StoredEvent", {**good, "ts": "1.0"}))
    state = encode(sample_task_state(DEFAULT_TYPES))
    refused("created_at", lambda: decode("TaskState", {**state, "created_at": "not a date"}))
    refused("created_at", lambda: decode("TaskState", {**state, "created_at": 1700000000}))
    refused("priority", lambda: decode("TaskState", {**state, "priority": True}))
    refused("status", lambda: decode("TaskState", {**state, "status": "DONE"}))
    refused("context_snapshot", lambda: decode("TaskState", {**state, "context_snapshot": ["x"]}))
    snapshot = state["context_snapshot"]
    assert isinstance(snapshot, dict)
    bad_snapshot = {**snapshot, "notify_on_complete": "yes"}
    refused(
        "context_snapshot.notify_on_complete",
        lambda: decode("TaskState", {**state, "context_snapshot": bad_snapshot}),
    )
    binding = encode(sample_remote_binding(DEFAULT_TYPES))
    refused("is_terminal", lambda: decode("RemoteBinding", {**binding, "is_terminal": 0}))


def test_decode_refuses_missing_required_fields() -> None:
    good = encode(sample_task_state(DEFAULT_TYPES))
    error = refused("task_id", lambda: decode("TaskState", {k: v for k, v in good.items() if k != "task_id"}))
    assert "lacks required field" in error.reason
    update = encode(sample_state_update(DEFAULT_TYPES))
    refused("update_id", lambda: decode("StateUpdate", {k: v for k, v in update.items() if k != "update_id"}))


def test_decode_refuses_a_non_object() -> None:
    with pytest.raises(InvalidPayloadError, match="StoredEvent"):
        decode("StoredEvent", ["not", "an", "object"])  # type: ignore[arg-type]


def test_decode_refuses_what_the_model_rejects() -> None:
    event = encode(sample_telemetry_event(DEFAULT_TYPES))
    with pytest.raises(InvalidPayloadError, match="TaskTelemetryEvent"):
        decode("TaskTelemetryEvent", {**event, "outcome": "exploded"})


# --- trajectories -------------------------------------------------------------------------------------


@dataclasses.dataclass
class NotebookTrajectory:
    """A trajectory object with its own wire form, like PenguiFlow's."""

    query: str
    steps: list[str]

    def serialise(self) -> dict[str, Any]:
        return {"query": self.query, "steps": list(self.steps)}

    @classmethod
    def from_serialised(cls, payload: Mapping[str, Any]) -> NotebookTrajectory:
        return cls(query=payload["query"], steps=list(payload["steps"]))


@dataclasses.dataclass
class UnregisteredTrajectory(NotebookTrajectory):
    pass


register_trajectory_type(NotebookTrajectory)


def _through_json(envelope: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(envelope, allow_nan=False))
    assert result == envelope
    return result


def test_mapping_trajectory_roundtrip() -> None:
    trajectory = {"query": "q", "steps": [{"action": {"next_node": "x"}, "observation": NESTED}]}
    envelope = encode_trajectory(trajectory)
    assert envelope == {"format": "mapping", "value": trajectory}
    assert decode_trajectory(_through_json(envelope)) == trajectory


def test_object_trajectory_roundtrip() -> None:
    trajectory = NotebookTrajectory(query="q\x00", steps=["a", "b"])
    envelope = encode_trajectory(trajectory)
    assert envelope["format"] == "object"
    assert envelope["type"] == f"{NotebookTrajectory.__module__}:NotebookTrajectory"
    assert envelope["value"] == {"query": "q\x00", "steps": ["a", "b"]}
    decoded = decode_trajectory(_through_json(envelope))
    assert type(decoded) is NotebookTrajectory
    assert decoded == trajectory


def test_unregistered_trajectory_comes_back_as_its_mapping() -> None:
    trajectory = UnregisteredTrajectory(query="q", steps=["a"])
    decoded = decode_trajectory(_through_json(encode_trajectory(trajectory)))
    assert decoded == {"query": "q", "steps": ["a"]}


def test_trajectory_refusals() -> None:
    refused("trajectory", lambda: encode_trajectory(["not", "a", "trajectory"]))  # type: ignore[arg-type]
    refused("trajectory[key #0 (str)][0]", lambda: encode_trajectory({"steps": [math.nan]}))
    bad = NotebookTrajectory(query="\ud800", steps=[])
    refused("trajectory.serialise()[key #0 (str)]", lambda: encode_trajectory(bad))
    refused("trajectory", lambda: decode_trajectory({"format": "mapping"}))


# --- property: any JSON payload round-trips exactly ---------------------------------------------------

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=40,
)


def assert_identical(left: Any, right: Any) -> None:
    """Equal, with the same JSON types throughout (1 != 1.0, -0.0 != 0.0 here)."""
    assert type(left) is type(right), (left, right)
    if isinstance(left, dict):
        assert list(left) == list(right)
        for key in left:
            assert_identical(left[key], right[key])
    elif isinstance(left, list):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_identical(a, b)
    elif isinstance(left, float):
        assert left == right
        assert math.copysign(1.0, left) == math.copysign(1.0, right)
    else:
        assert left == right


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_random_json_payloads_roundtrip_exactly(value: Any) -> None:
    assert_identical(to_json_value(value), value)
    event = _event(payload={"value": value})
    encoded = encode(event)
    assert_identical(json.loads(json.dumps(encoded, allow_nan=False)), encoded)
    decoded = decode("StoredEvent", json.loads(json.dumps(encoded)))
    assert_identical(decoded.payload["value"], value)
    update = sample_state_update(DEFAULT_TYPES).model_copy(update={"content": value})
    decoded_update = decode("StateUpdate", json.loads(json.dumps(encode(update))))
    assert_identical(decoded_update.content, value)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_random_mapping_trajectories_roundtrip_exactly(value: dict[str, Any]) -> None:
    assert_identical(decode_trajectory(_through_json(encode_trajectory(value))), value)


# --- PenguiFlow interoperability ----------------------------------------------------------------------


@pytest.fixture
def pf_types() -> RecordTypes:
    pytest.importorskip("penguiflow")
    return penguiflow_types()


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_penguiflow_fields_equal_codec_fields(name: str, pf_types: RecordTypes) -> None:
    """PenguiFlow's classes have exactly the fields our codecs read and write, in the same order."""
    assert [field.name for field in CODECS[name].fields] == model_fields(getattr(pf_types, name))


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_penguiflow_objects_encode_like_ours(name: str, pf_types: RecordTypes) -> None:
    theirs = SAMPLES[name](pf_types)
    ours = SAMPLES[name](DEFAULT_TYPES)
    assert type(theirs).__module__.startswith("penguiflow")
    assert encode(theirs) == encode(ours)
    _, decoded = roundtrip(name, theirs, pf_types)
    assert type(decoded) is type(theirs)
    assert decoded == theirs
    assert decode(name, encode(ours), pf_types) == theirs
    assert decode(name, encode(theirs)) == ours


def test_penguiflow_task_state_holds_penguiflow_snapshot(pf_types: RecordTypes) -> None:
    decoded = decode("TaskState", encode(sample_task_state(DEFAULT_TYPES)), pf_types)
    assert type(decoded.context_snapshot) is pf_types.TaskContextSnapshot
    assert type(decoded.status) is pf_types.TaskStatus


def test_penguiflow_remote_binding_311_fields(pf_types: RecordTypes) -> None:
    binding = sample_remote_binding(pf_types)
    encoded = encode(binding)
    for field in ("router_session_id", "remote_skill", "tenant_id", "user_id", "last_remote_task_id"):
        assert encoded[field] == getattr(binding, field)
    assert encoded["is_terminal"] is True
    assert decode("RemoteBinding", encoded, pf_types) == binding


def test_penguiflow_enums_inside_payloads(pf_types: RecordTypes) -> None:
    event = _event(payload={"status": pf_types.TaskStatus.RUNNING, pf_types.UpdateType.RESULT: 1})
    assert encode(event)["payload"] == {"status": "RUNNING", "RESULT": 1}


def test_penguiflow_flow_event_roundtrip(pf_types: RecordTypes) -> None:
    from penguiflow.metrics import FlowEvent

    flow_event = FlowEvent(
        event_type="node_error",
        ts=1716000000.5,
        node_name="llm",
        node_id="llm-1",
        trace_id="trace-1",
        attempt=2,
        latency_ms=10.5,
        queue_depth_in=1,
        queue_depth_out=2,
        outgoing_edges=3,
        queue_maxsize=100,
        trace_pending=4,
        trace_inflight=5,
        trace_cancelled=False,
        extra={"flow_error": {"code": "TOOL_EXECUTION_FAILED", "message": "500"}},
    )
    stored = pf_types.StoredEvent.from_flow_event(flow_event)
    ours = m.StoredEvent.from_flow_event(flow_event)
    assert encode(stored) == encode(ours)
    assert decode("StoredEvent", encode(stored), pf_types) == stored


def test_penguiflow_trajectory_roundtrip() -> None:
    pytest.importorskip("penguiflow")
    from penguiflow.planner.migration import normalize_action
    from penguiflow.planner.trajectory import Trajectory, TrajectoryStep

    trajectory = Trajectory(
        query="what changed in Q3?",
        llm_context={"region": "EMEA"},
        tool_context={"budget": 3},
        artifacts={"chart": {"id": "a1"}},
        sources=[{"url": "https://example.test"}],
        metadata={"attempt": 2},
        hint_state={"hinted": True},
        resume_user_input="approved",
        steering_inputs=["focus on EMEA"],
    )
    trajectory.steps.append(
        TrajectoryStep(
            action=normalize_action({"next_node": "search", "args": {"q": "q3"}}), observation={"hits": 2}
        )
    )
    envelope = encode_trajectory(trajectory)
    assert envelope["type"] == "penguiflow.planner.trajectory:Trajectory"
    assert envelope["value"] == json.loads(json.dumps(trajectory.serialise()))
    decoded = decode_trajectory(_through_json(envelope))
    assert type(decoded) is Trajectory
    assert decoded == trajectory
    assert decoded.serialise() == trajectory.serialise()
