"""encode_call / decode_call: every write call round-trips in its original shape; bad data is refused."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from guarded.codec import DEFAULT_TYPES, RecordTypes, penguiflow_types, register_trajectory_type
from guarded.deadletter import CALL_SPECS, decode_call, encode_call
from guarded.errors import InvalidPayloadError
from tests.test_codec import (
    NESTED,
    sample_planner_event,
    sample_remote_binding,
    sample_state_update,
    sample_steering_event,
    sample_stored_event,
    sample_task_state,
)


class Steps:
    """A trajectory object with a wire form, like PenguiFlow's ``Trajectory``."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def serialise(self) -> dict[str, Any]:
        return {"steps": list(self.steps)}

    @classmethod
    def from_serialised(cls, payload: Any) -> Steps:
        return cls(list(payload["steps"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Steps) and other.steps == self.steps

    __hash__ = None  # type: ignore[assignment]


register_trajectory_type(Steps)

Calls = list[tuple[str, tuple[Any, ...], dict[str, Any]]]


def write_calls(t: RecordTypes) -> Calls:
    """One call of every known write method, mixing positional and keyword forms."""
    return [
        ("save_event", (sample_stored_event(t),), {}),
        ("save_event", (), {"event": sample_stored_event(t)}),
        ("save_events", ([sample_stored_event(t), sample_stored_event(t)],), {}),
        ("save_planner_state", ("token-\u00e9", {"resume": NESTED, "step": 3}), {}),
        ("save_planner_state", ("token-2",), {"payload": {"a": [1, 2.5, None]}}),
        ("save_memory_state", (), {"key": "tenant:user:session", "state": {"summary": "x", "n": NESTED}}),
        ("save_task", (sample_task_state(t),), {}),
        ("save_update", (sample_state_update(t),), {}),
        ("save_task_update", (), {"update": sample_state_update(t)}),
        ("save_updates", ([sample_state_update(t)],), {}),
        ("save_steering", (sample_steering_event(t),), {}),
        ("save_trajectory", ("trace-1", "session-1", {"steps": [{"thought": "x"}], "n": NESTED}), {}),
        ("save_trajectory", ("trace-1",), {"session_id": "session-1", "trajectory": Steps(["a", "b"])}),
        ("save_planner_event", ("trace-1", sample_planner_event(t)), {}),
        (
            "save_planner_events",
            ([("trace-1", sample_planner_event(t)), ("trace-2", sample_planner_event(t))],),
            {},
        ),
        ("save_remote_binding", (sample_remote_binding(t),), {}),
        ("mark_binding_terminal", (), {"trace_id": "trace-1", "context_id": None, "task_id": "task-1"}),
        ("mark_binding_terminal", (), {"trace_id": "trace-1", "context_id": "ctx", "task_id": "task-1"}),
        ("save_custom_thing", ("id-1", {"nested": NESTED}, [1, 2]), {"flag": True, "ratio": 0.5}),
        # Artifact puts: more cases in tests/deadletter/test_artifact_calls.py.
        ("put_bytes", (b"\x00\xff",), {"scope": t.ArtifactScope(session_id="s1"), "meta": {"n": NESTED}}),
        ("put_text", (), {"text": "t\u00e9xt", "mime_type": "text/markdown", "namespace": "ns"}),
    ]


def normalised(value: Any) -> Any:
    """Tuples compare as lists (JSON has no tuple), except the (trace_id, event) pairs, kept as tuples."""
    if isinstance(value, list):
        return [normalised(item) for item in value]
    return value


def roundtrip(method: str, args: tuple[Any, ...], kwargs: dict[str, Any], types: RecordTypes) -> Any:
    data = encode_call(method, args, kwargs)
    stored = json.loads(json.dumps(data, allow_nan=False))
    return decode_call(method, stored, types)


def test_every_known_write_method_has_a_spec_and_a_sample() -> None:
    sampled = {method for method, _, _ in write_calls(DEFAULT_TYPES)}
    assert set(CALL_SPECS) <= sampled


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    write_calls(DEFAULT_TYPES),
    ids=[f"{index}-{call[0]}" for index, call in enumerate(write_calls(DEFAULT_TYPES))],
)
def test_round_trip_keeps_the_call_and_its_shape(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    decoded_args, decoded_kwargs = roundtrip(method, args, kwargs, DEFAULT_TYPES)
    assert isinstance(decoded_args, tuple)
    assert len(decoded_args) == len(args)
    assert set(decoded_kwargs) == set(kwargs)
    assert [normalised(value) for value in decoded_args] == [normalised(value) for value in args]
    assert {name: normalised(value) for name, value in decoded_kwargs.items()} == kwargs
    for original, decoded in zip(
        [*args, *kwargs.values()], [*decoded_args, *decoded_kwargs.values()], strict=True
    ):
        assert type(decoded) is type(original) or isinstance(original, tuple | list)


def test_records_come_back_as_classes_not_dicts() -> None:
    args, _ = roundtrip(
        "save_planner_events", ([("t", sample_planner_event(DEFAULT_TYPES))],), {}, DEFAULT_TYPES
    )
    trace_id, planner_event = args[0][0]
    assert trace_id == "t"
    assert type(planner_event) is DEFAULT_TYPES.PlannerEvent
    args, _ = roundtrip("save_trajectory", ("t", "s", Steps(["x"])), {}, DEFAULT_TYPES)
    assert args[2] == Steps(["x"])


def _penguiflow() -> RecordTypes:
    try:
        return penguiflow_types()
    except ImportError:
        pytest.skip("penguiflow is not installed")


@pytest.mark.parametrize("index", range(len(write_calls(DEFAULT_TYPES))))
def test_round_trip_with_penguiflow_records(index: int) -> None:
    types = _penguiflow()
    method, args, kwargs = write_calls(types)[index]
    decoded_args, decoded_kwargs = roundtrip(method, args, kwargs, types)
    assert [normalised(value) for value in decoded_args] == [normalised(value) for value in args]
    assert decoded_kwargs == kwargs


def test_penguiflow_records_decode_into_our_classes_too() -> None:
    types = _penguiflow()
    task = sample_task_state(types)
    (decoded,), _ = roundtrip("save_task", (task,), {}, DEFAULT_TYPES)
    assert type(decoded) is DEFAULT_TYPES.TaskState
    assert decoded.task_id == task.task_id
    assert decoded.context_snapshot.llm_context == task.context_snapshot.llm_context


def test_nul_characters_in_ids_and_payloads_survive() -> None:
    decoded = roundtrip("save_memory_state", ("k\x00ey", {"v": "a\x00b"}), {}, DEFAULT_TYPES)
    assert decoded == (("k\x00ey", {"v": "a\x00b"}), {})


SECRET = "hunter2-secret"


class Exploding:
    @property
    def trace_id(self) -> str:
        raise RuntimeError(SECRET)


BAD_CALLS: list[tuple[str, Callable[[], tuple[str, tuple[Any, ...], dict[str, Any]]], str]] = [
    (
        "nan in a payload",
        lambda: ("save_memory_state", ("k", {"score": math.nan}), {}),
        "state[key #0 (str)]",
    ),
    (
        "inf in a planner state",
        lambda: ("save_planner_state", ("t",), {"payload": {"x": [math.inf]}}),
        "payload[key #0 (str)][0]",
    ),
    (
        "lone surrogate in a value",
        lambda: ("save_memory_state", ("k", {"v": SECRET + "\ud800"}), {}),
        "state[key #0 (str)]",
    ),
    ("lone surrogate in an id", lambda: ("save_planner_state", (SECRET + "\udfff", {}), {}), "token"),
    ("None token", lambda: ("save_planner_state", (None, {}), {}), "token"),
    ("None memory key", lambda: ("save_memory_state", (None, {}), {}), "key"),
    ("None trace id", lambda: ("save_trajectory", (None, "s", {}), {}), "trace_id"),
    (
        "None task id",
        lambda: ("mark_binding_terminal", (), {"trace_id": "t", "context_id": None, "task_id": None}),
        "task_id",
    ),
    ("state not a mapping", lambda: ("save_memory_state", ("k", [1, 2]), {}), "state"),
    ("events not a list", lambda: ("save_events", (sample_stored_event(DEFAULT_TYPES),), {}), "events"),
    (
        "nan event timestamp",
        lambda: ("save_events", ([sample_stored_event(DEFAULT_TYPES), _nan_event()],), {}),
        "events[1].ts",
    ),
    ("not a record", lambda: ("save_event", ({"trace_id": "t"},), {}), "event.trace_id"),
    ("record attribute raises", lambda: ("save_event", (Exploding(),), {}), "event"),
    ("unknown method, object arg", lambda: ("save_custom", (object(),), {}), "args[0]"),
    ("unknown method, object kwarg", lambda: ("save_custom", (), {"blob": b"bytes"}), "blob"),
    ("unknown method, nan kwarg", lambda: ("save_custom", (), {"n": math.nan}), "n"),
]


def _nan_event() -> Any:
    event = sample_stored_event(DEFAULT_TYPES)
    event.ts = math.nan
    return event


@pytest.mark.parametrize(("label", "make", "path"), BAD_CALLS, ids=[case[0] for case in BAD_CALLS])
def test_bad_calls_are_refused_naming_the_path_not_the_value(
    label: str, make: Callable[[], tuple[str, tuple[Any, ...], dict[str, Any]]], path: str
) -> None:
    method, args, kwargs = make()
    with pytest.raises(InvalidPayloadError) as caught:
        encode_call(method, args, kwargs)
    error = caught.value
    assert error.method == method
    assert error.path == path
    assert SECRET not in str(error)


def test_unencodable_steering_payload_is_stored_sanitized() -> None:
    event = sample_steering_event(DEFAULT_TYPES)
    event.payload = {"instruction": "go", "score": math.nan}
    (decoded,), _ = roundtrip("save_steering", (event,), {}, DEFAULT_TYPES)
    assert decoded.payload["instruction"] == "go"
    assert decoded.payload["score"] == "nan"


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"args": {}, "kwargs": {}},
        {"args": [], "kwargs": []},
        {"args": [{"trace_id": "t"}], "kwargs": {}},
        {"args": [], "kwargs": {"event": "not an object"}},
        {"args": [1], "kwargs": {}},
        "not a mapping",
    ],
)
def test_decoding_a_damaged_call_raises_invalid_payload(data: Any) -> None:
    with pytest.raises(InvalidPayloadError) as caught:
        decode_call("save_event", data)
    assert caught.value.method == "save_event"


def test_encoded_call_does_not_share_state_with_the_caller() -> None:
    state = {"items": [1, 2]}
    data = encode_call("save_memory_state", ("k", state), {})
    state["items"].append(3)
    assert decode_call("save_memory_state", data) == (("k", {"items": [1, 2]}), {})
