"""Steering sanitization and validation (spec 000 "Steering Payload Sanitization")."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum, IntEnum
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from guarded.errors import SteeringValidationError
from guarded.models import SteeringEvent, SteeringEventType
from guarded.steering import (
    MAX_STEERING_DEPTH,
    MAX_STEERING_KEYS,
    MAX_STEERING_LIST_ITEMS,
    MAX_STEERING_PAYLOAD_BYTES,
    MAX_STEERING_STRING,
    TRUNCATED,
    TRUNCATED_KEYS,
    sanitize_payload,
    sanitize_steering_event,
    validate_steering_event,
)


def strict_size(payload: dict[str, Any]) -> int:
    """UTF-8 size of the strict JSON encoding; raises if the payload is not strict, storable JSON."""
    return len(json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8"))


def nested(levels: int, leaf: Any = "leaf") -> dict[str, Any]:
    value: Any = leaf
    for _ in range(levels):
        value = {"k": value}
    return value  # type: ignore[no-any-return]


def event(event_type: SteeringEventType, payload: dict[str, Any]) -> SteeringEvent:
    return SteeringEvent(session_id="s", task_id="t", event_type=event_type, payload=payload)


def test_limits_are_the_spec_values() -> None:
    assert (
        MAX_STEERING_PAYLOAD_BYTES,
        MAX_STEERING_DEPTH,
        MAX_STEERING_KEYS,
        MAX_STEERING_LIST_ITEMS,
        MAX_STEERING_STRING,
    ) == (16_384, 6, 64, 50, 4_096)


class TestLimits:
    def test_six_levels_of_containers_are_kept_and_values_below_truncated(self) -> None:
        result: Any = sanitize_payload(nested(6))
        for _ in range(5):
            result = result["k"]
        assert result == {"k": TRUNCATED}

    def test_five_levels_keep_their_leaf(self) -> None:
        result: Any = sanitize_payload(nested(5))
        for _ in range(5):
            result = result["k"]
        assert result == "leaf"

    def test_depth_limit_stops_reference_cycles(self) -> None:
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        assert strict_size(sanitize_payload(cyclic)) < 200

    def test_keys_beyond_the_limit_are_dropped_and_flagged(self) -> None:
        result = sanitize_payload({f"k{i}": i for i in range(MAX_STEERING_KEYS + 6)})
        assert len(result) == MAX_STEERING_KEYS + 1
        assert result[TRUNCATED_KEYS] is True
        assert "k63" in result
        assert "k64" not in result

    def test_exactly_the_key_limit_is_not_flagged(self) -> None:
        result = sanitize_payload({f"k{i}": i for i in range(MAX_STEERING_KEYS)})
        assert len(result) == MAX_STEERING_KEYS
        assert TRUNCATED_KEYS not in result

    def test_list_items_beyond_the_limit_are_dropped_and_flagged(self) -> None:
        result = sanitize_payload({"items": list(range(MAX_STEERING_LIST_ITEMS + 10))})
        assert result["items"] == [*range(MAX_STEERING_LIST_ITEMS), TRUNCATED]

    def test_exactly_the_list_limit_is_not_flagged(self) -> None:
        result = sanitize_payload({"items": list(range(MAX_STEERING_LIST_ITEMS))})
        assert result["items"] == list(range(MAX_STEERING_LIST_ITEMS))

    def test_tuples_and_sets_become_lists(self) -> None:
        result = sanitize_payload({"t": (1, 2), "s": {3}, "f": frozenset({4})})
        # As PenguiFlow 3.11: lists, tuples and sets become lists; anything else (a frozenset) its str()
        assert result == {"t": [1, 2], "s": [3], "f": "frozenset({4})"}

    def test_long_strings_are_truncated(self) -> None:
        result = sanitize_payload({"text": "x" * (MAX_STEERING_STRING + 100)})
        assert result["text"] == "x" * MAX_STEERING_STRING

    def test_long_keys_are_truncated_to_64_characters(self) -> None:
        assert list(sanitize_payload({"k" * 100: 1})) == ["k" * 64]

    def test_oversized_payload_becomes_a_truncated_summary_within_the_limit(self) -> None:
        payload = {f"part{i}": "y" * 4000 for i in range(6)}
        result = sanitize_payload(payload)
        assert result["truncated"] is True
        assert set(result) == {"truncated", "summary"}
        assert result["summary"].startswith('{"part0": "yyy')
        assert strict_size(result) <= MAX_STEERING_PAYLOAD_BYTES

    def test_summary_of_multibyte_text_still_fits_the_byte_limit(self) -> None:
        # 4096 four-byte characters alone are 16 KiB: PenguiFlow's fallback overflows here.
        payload = {f"part{i}": "\U0001f600" * 4000 for i in range(6)}
        result = sanitize_payload(payload)
        assert result["truncated"] is True
        assert strict_size(result) <= MAX_STEERING_PAYLOAD_BYTES

    def test_summary_of_escape_heavy_text_fits_the_byte_limit(self) -> None:
        payload = {f"part{i}": '"\\' * 2000 for i in range(6)}
        assert strict_size(sanitize_payload(payload)) <= MAX_STEERING_PAYLOAD_BYTES

    def test_custom_byte_limit(self) -> None:
        result = sanitize_payload({"text": "z" * 500}, max_payload_bytes=100)
        # As PenguiFlow 3.11: the summary is the first MAX_STEERING_STRING characters of the JSON text
        assert result == {"truncated": True, "summary": json.dumps({"text": "z" * 500})}

    def test_payload_just_under_the_limit_is_kept(self) -> None:
        payload = {"a": "x" * 4000, "b": "x" * 4000, "c": "x" * 4000, "d": "x" * 4000}
        assert strict_size(payload) <= MAX_STEERING_PAYLOAD_BYTES
        assert sanitize_payload(payload) == payload


class Colour(str, Enum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


class TestStrictJson:
    def test_non_finite_floats_become_their_string_form(self) -> None:
        result = sanitize_payload({"a": float("nan"), "b": float("inf"), "c": float("-inf"), "d": 1.5})
        assert result == {"a": "nan", "b": "inf", "c": "-inf", "d": 1.5}

    def test_lone_surrogates_in_values_and_keys_become_replacement_characters(self) -> None:
        result = sanitize_payload({"k\udc00": "a\ud800b", "list": ["\udfff"]})
        assert result == {"k\ufffd": "a\ufffdb", "list": ["\ufffd"]}
        strict_size(result)

    def test_a_surrogate_pair_is_joined_into_its_character(self) -> None:
        assert sanitize_payload({"emoji": "\ud83d\ude00"}) == {"emoji": "\U0001f600"}

    def test_non_string_keys_become_strings(self) -> None:
        result = sanitize_payload({1: "a", None: "b", 2.5: "c", Colour.RED: "d"})
        assert result == {"1": "a", "None": "b", "2.5": "c", "red": "d"}

    def test_bool_stays_bool_and_enums_become_their_values(self) -> None:
        result = sanitize_payload({"flag": True, "off": False, "colour": Colour.RED, "level": Level.HIGH})
        assert result == {"flag": True, "off": False, "colour": "red", "level": 3}
        assert result["flag"] is True
        assert isinstance(result["level"], int)  # kept, as PenguiFlow keeps it; JSON writes 3
        assert json.dumps(result["level"]) == "3"
        assert type(result["colour"]) is str

    def test_unknown_objects_become_truncated_strings(self) -> None:
        class Big:
            def __str__(self) -> str:
                return "B" * 10_000

        result = sanitize_payload({"obj": Big(), "bytes": b"\x00\xff"})
        assert result["obj"] == "B" * MAX_STEERING_STRING
        assert result["bytes"] == "b'\\x00\\xff'"

    def test_an_object_whose_str_fails_is_described(self) -> None:
        assert sanitize_payload({"obj": Unprintable()}) == {"obj": "<unprintable Unprintable>"}

    def test_huge_integers_are_described(self) -> None:
        result = sanitize_payload({"n": 10**5000, "small": 10**30})
        assert result["n"].startswith("<integer of ")
        assert result["small"] == 10**30
        strict_size(result)

    def test_non_mapping_payload_is_wrapped(self) -> None:
        assert sanitize_payload(["a", float("nan")]) == {"value": ["a", "nan"]}

    def test_input_is_not_mutated(self) -> None:
        payload = {"text": "x" * 5000, "n": [float("nan")]}
        sanitize_payload(payload)
        assert len(payload["text"]) == 5000


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(st.characters(), max_size=30),
    st.sampled_from(["\ud800", "x\udfffy", "\ud83d\ude00"]),
)
untrusted = st.recursive(
    json_leaves | st.builds(str.__mul__, st.characters(), st.integers(4000, 5000)),
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.builds(lambda n: list(range(n)), st.integers(45, 55)),
        st.dictionaries(
            st.one_of(st.text(st.characters(), max_size=70), st.integers()), children, max_size=6
        ),
    ),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(st.characters(), max_size=10), untrusted, max_size=10))
@example({"": "\U00010000" * 4095})  # a summary of 4-byte characters: PenguiFlow's is 16,403 bytes
def test_sanitized_payload_is_always_strict_bounded_json_and_stable(payload: dict[str, Any]) -> None:
    result = sanitize_payload(payload)
    assert strict_size(result) <= MAX_STEERING_PAYLOAD_BYTES
    assert sanitize_payload(result) == result
    assert json.loads(json.dumps(result)) == result


class TestSanitizeEvent:
    def test_returns_a_sanitized_copy_and_leaves_the_event_alone(self) -> None:
        original = event(SteeringEventType.USER_MESSAGE, {"text": "hi", "n": float("nan")})
        copy = sanitize_steering_event(original)
        assert copy is not original
        assert type(copy) is SteeringEvent
        assert copy.payload == {"text": "hi", "n": "nan"}
        assert copy.event_id == original.event_id
        assert copy.created_at == original.created_at
        assert original.payload["text"] == "hi"
        assert original.payload["n"] != original.payload["n"]

    def test_custom_byte_limit(self) -> None:
        copy = sanitize_steering_event(
            event(SteeringEventType.USER_MESSAGE, {"text": "w" * 300}), max_payload_bytes=64
        )
        # As PenguiFlow 3.11: sanitized with the default limit, then summarised when over this one
        assert copy.payload == {"truncated": True, "summary": json.dumps({"text": "w" * 300})}

    def test_dataclass_events_are_copied_with_replace(self) -> None:
        @dataclasses.dataclass
        class Plain:
            event_type: str
            payload: dict[str, Any]

        original = Plain("CANCEL", {"reason": "\ud800"})
        copy = sanitize_steering_event(original)
        assert copy == Plain("CANCEL", {"reason": "\ufffd"})
        assert original.payload == {"reason": "\ud800"}

    def test_an_uncopyable_event_is_a_type_error(self) -> None:
        class Opaque:
            payload: dict[str, Any] = {}  # noqa: RUF012

        with pytest.raises(TypeError, match="cannot copy"):
            sanitize_steering_event(Opaque())


T = SteeringEventType

VALID_PAYLOADS = [
    (T.INJECT_CONTEXT, {"text": "note this", "scope": "task_only", "severity": "correction"}),
    (T.REDIRECT, {"instruction": "do y", "constraints": {"max": 1}}),
    (T.REDIRECT, {"goal": "a goal"}),
    (T.REDIRECT, {"query": "a query"}),
    (T.CANCEL, {}),
    (T.CANCEL, {"reason": "user", "hard": True}),
    (T.PRIORITIZE, {"priority": 0}),
    (T.PRIORITIZE, {"priority": -3}),
    (T.PAUSE, {}),
    (T.RESUME, {"reason": "back"}),
    (T.APPROVE, {"resume_token": "tok", "decision": "yes"}),
    (T.APPROVE, {"patch_id": "p1"}),
    (T.REJECT, {"event_id": "e1"}),
    (T.USER_MESSAGE, {"text": "hello", "active_tasks": ["t1"]}),
    (T.PRIORITIZE, {"priority": True}),  # as PenguiFlow 3.11: a boolean is an int
]


@pytest.mark.parametrize(("event_type", "payload"), VALID_PAYLOADS)
def test_valid_payloads_pass(event_type: SteeringEventType, payload: dict[str, Any]) -> None:
    validate_steering_event(event(event_type, payload))


INVALID_PAYLOADS = [
    (T.INJECT_CONTEXT, {}, "INJECT_CONTEXT requires non-empty 'text'"),
    (T.INJECT_CONTEXT, {"text": "   "}, "INJECT_CONTEXT requires non-empty 'text'"),
    (T.INJECT_CONTEXT, {"text": 5}, "INJECT_CONTEXT requires non-empty 'text'"),
    (
        T.INJECT_CONTEXT,
        {"text": "x", "scope": "all"},
        "INJECT_CONTEXT 'scope' must be 'foreground' or 'task_only'",
    ),
    (
        T.INJECT_CONTEXT,
        {"text": "x", "severity": "loud"},
        "INJECT_CONTEXT 'severity' must be 'note' or 'correction'",
    ),
    (T.REDIRECT, {}, "REDIRECT requires non-empty 'instruction' (or 'goal'/'query')"),
    (T.REDIRECT, {"instruction": " "}, "REDIRECT requires non-empty 'instruction' (or 'goal'/'query')"),
    (T.REDIRECT, {"goal": "g", "constraints": ["a"]}, "REDIRECT 'constraints' must be an object"),
    (T.CANCEL, {"reason": 3}, "CANCEL 'reason' must be a string"),
    (T.CANCEL, {"hard": "yes"}, "CANCEL 'hard' must be a boolean"),
    (T.PRIORITIZE, {}, "PRIORITIZE requires integer 'priority'"),
    (T.PRIORITIZE, {"priority": "high"}, "PRIORITIZE requires integer 'priority'"),
    (T.PRIORITIZE, {"priority": 1.5}, "PRIORITIZE requires integer 'priority'"),
    (T.PAUSE, {"reason": ["x"]}, "PAUSE 'reason' must be a string"),
    (T.RESUME, {"reason": 1}, "RESUME 'reason' must be a string"),
    (T.APPROVE, {}, "APPROVE requires non-empty 'resume_token' (or 'patch_id'/'event_id')"),
    (T.APPROVE, {"resume_token": 7}, "APPROVE requires non-empty 'resume_token' (or 'patch_id'/'event_id')"),
    (T.REJECT, {"patch_id": ""}, "REJECT requires non-empty 'resume_token' (or 'patch_id'/'event_id')"),
    (T.REJECT, {"patch_id": "p", "decision": 1}, "REJECT 'decision' must be a string"),
    (T.USER_MESSAGE, {}, "USER_MESSAGE requires non-empty 'text'"),
    (T.USER_MESSAGE, {"text": ""}, "USER_MESSAGE requires non-empty 'text'"),
    (T.USER_MESSAGE, {"text": "hi", "active_tasks": "t1"}, "USER_MESSAGE 'active_tasks' must be a list"),
]


@pytest.mark.parametrize(("event_type", "payload", "message"), INVALID_PAYLOADS)
def test_invalid_payloads_name_the_field(
    event_type: SteeringEventType, payload: dict[str, Any], message: str
) -> None:
    with pytest.raises(SteeringValidationError) as caught:
        validate_steering_event(event(event_type, payload))
    assert caught.value.errors == [message]
    assert message in str(caught.value)


def test_every_problem_is_reported() -> None:
    with pytest.raises(SteeringValidationError) as caught:
        validate_steering_event(event(T.INJECT_CONTEXT, {"scope": "x", "severity": "y"}))
    assert len(caught.value.errors) == 3


def test_validation_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="requires non-empty 'text'"):
        validate_steering_event(event(T.USER_MESSAGE, {}))


def test_a_payload_that_is_not_an_object_is_rejected() -> None:
    broken = event(T.CANCEL, {}).model_copy(update={"payload": ["not", "a", "dict"]})
    with pytest.raises(SteeringValidationError) as caught:
        validate_steering_event(broken)
    assert caught.value.errors == ["payload must be an object"]


def test_an_unknown_event_type_is_rejected() -> None:
    broken = event(T.CANCEL, {}).model_copy(update={"event_type": "EXPLODE"})
    with pytest.raises(SteeringValidationError) as caught:
        validate_steering_event(broken)
    [message] = caught.value.errors
    assert message.startswith("unknown steering event_type (a str; known: INJECT_CONTEXT, REDIRECT,")
    assert "EXPLODE" not in str(caught.value)  # the unknown value is not repeated


def test_an_oversized_user_message_fails_validation_after_sanitization() -> None:
    sanitized = sanitize_steering_event(event(T.USER_MESSAGE, {"text": "x", "blob": ["y" * 4000] * 5}))
    with pytest.raises(SteeringValidationError, match="USER_MESSAGE requires non-empty 'text'"):
        validate_steering_event(sanitized)
