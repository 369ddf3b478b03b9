"""``encode_event``'s ``orjson`` path writes exactly what its C-encoder path writes.

The pins (test_event_encoding_pins.py) hold rows written before the ``orjson`` path existed; here
random events go through both paths of today's encoder and must give the same row: fingerprint,
stored payload text, every column, or the same refusal.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guarded.backends.postgres import event_log
from guarded.backends.postgres.event_log import encode_event
from guarded.backends.postgres.json_codec import ORJSON_AGREES, fixed_float, orjson_ready
from guarded.errors import InvalidPayloadError
from guarded.models import StoredEvent

from .event_encoding_cases import refused_events, valid_events

any_float = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e-4, 9.9e-5, 1e-5, 1e-9, 1e-10, 5e-324, 1e16, 9999999999999998.0, 1e22, -0.0, 0.0, math.nan]
)
any_text = st.text() | st.text(
    alphabet=st.sampled_from(["\x00", "\x1f", "\x7f", "\ue000", "é", "🐧", "\u2028", '"', "\\", "\ud800"])
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1])
    | any_float
    | any_text
)
payloads = st.dictionaries(
    any_text,
    st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
        max_leaves=15,
    ),
    max_size=6,
)


def _outcome(event: Any) -> Any:
    try:
        return encode_event(event)
    except InvalidPayloadError as exc:
        return ("refused", str(exc))


def _both_paths(event: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    fast = _outcome(event)
    with monkeypatch.context() as patched:
        patched.setattr(event_log, "ORJSON_AGREES", False)
        slow = _outcome(event)
    return fast, slow


def test_the_installed_orjson_agrees_with_the_c_encoder() -> None:
    assert ORJSON_AGREES


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=payloads, ts=any_float, kind=any_text, node=st.none() | any_text, trace=st.none() | any_text)
def test_both_paths_give_the_same_row(
    payload: dict[str, Any],
    ts: float,
    kind: str,
    node: str | None,
    trace: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    event = StoredEvent(trace_id=trace, ts=ts, kind=kind, node_name=node, node_id=node, payload=payload)
    fast, slow = _both_paths(event, monkeypatch)
    assert fast == slow


def test_both_paths_agree_on_every_pinned_case(monkeypatch: pytest.MonkeyPatch) -> None:
    for event in [*valid_events(), *refused_events()]:
        fast, slow = _both_paths(event, monkeypatch)
        assert fast == slow


def test_realistic_events_take_the_orjson_path() -> None:
    """PenguiFlow-shaped events are what the speed-up is for: they must not fall back."""
    event = valid_events()[0]
    assert fixed_float(event.ts)
    assert orjson_ready(event.payload)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, 1e16, 1e-5, 5e-324, 9.99e-5],
)
def test_floats_with_an_exponent_or_no_json_form_leave_the_orjson_path(value: float) -> None:
    assert not fixed_float(value)
    assert not orjson_ready({"a": [{"b": value}]})


def test_deep_or_wide_integers_fall_back_and_keep_their_text(monkeypatch: pytest.MonkeyPatch) -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    for payload in ({"n": 2**64}, {"n": -(2**63) - 1}, {"n": 10**600}, {"deep": deep}):
        event = StoredEvent(trace_id="t", ts=1.0, kind="k", node_name=None, node_id=None, payload=payload)
        fast, slow = _both_paths(event, monkeypatch)
        assert fast == slow
        assert len(fast) == 7  # a row, not a refusal
