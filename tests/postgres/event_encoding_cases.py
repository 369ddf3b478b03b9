"""Events whose rows ``encode_event`` must keep producing byte for byte (see test_event_encoding_pins.py).

The cases are built deterministically (explicit edge cases, PenguiFlow-shaped events and a seeded
generator); ``event_encoding_pins.json`` holds the fingerprint and stored payload text the encoder
produced for each before it was reworked. Rows already in databases carry
those fingerprints: a retried save must keep hitting ``ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

import enum
import random
import types
from collections import OrderedDict
from typing import Any

from benchmarks.postgres_bench import runtime_event
from guarded.models import StoredEvent

TRICKY_STRINGS = [
    "",
    "plain",
    "\x00",
    "a\x00b",
    "\ue000",
    "\ue000\ue001\ue002",
    "é",
    "ünïcödé",
    "🐧",
    "\u2028\u2029",
    "\x7f",
    "\x1f\x01\x08\x0c\n\r\t",
    '"quoted"',
    "back\\slash",
    "/slash/",
    "日本語",
    "\ufeff",
    "\U0010ffff",
    "<script>&amp;</script>",
]
TRICKY_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1e16,
    1e15,
    9999999999999998.0,
    1.5e300,
    -1.7976931348623157e308,
    5e-324,
    1e-5,
    0.0001,
    1e-7,
    123456789.123456789,
    2.0**53,
    3.141592653589793,
    1e22,
    1e21,
    1702857600.001,
]
TRICKY_INTS = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**64) - 7, 10**30, -(10**40), 10**600]


class Color(enum.IntEnum):
    RED = 1


class Mood(enum.Enum):
    HAPPY = "happy"


class Label(str):
    pass


class Ratio(float):
    pass


def _penguiflow(index: int, trace_id: str | None) -> StoredEvent:
    return runtime_event(index, trace_id)


def _random_value(rng: random.Random, depth: int) -> Any:
    choice = rng.randrange(10 if depth < 4 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.choice(TRICKY_INTS[:-1]) if rng.random() < 0.5 else rng.randrange(-(10**6), 10**6)
    if choice == 3:
        if rng.random() < 0.5:
            return rng.choice(TRICKY_FLOATS)
        return (rng.random() - 0.5) * 10.0 ** rng.randrange(-30, 30)
    if choice in (4, 5):
        return rng.choice(TRICKY_STRINGS) + rng.choice(TRICKY_STRINGS)
    if choice in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return _random_mapping(rng, depth + 1)


def _random_mapping(rng: random.Random, depth: int) -> dict[str, Any]:
    keys = [rng.choice(TRICKY_STRINGS) + str(rng.randrange(50)) for _ in range(rng.randrange(7))]
    return {key: _random_value(rng, depth) for key in keys}


def valid_events() -> list[Any]:
    """Events ``encode_event`` accepts, in a fixed order."""
    events: list[Any] = []
    for trace in ("trace-1", None, "", "tr\x00ace", "\ue000x", "trace-é"):
        events.append(_penguiflow(len(events), trace))
    for index in range(20):
        events.append(_penguiflow(index * 7919, f"bench-trace-{index % 3}"))
    base: dict[str, Any] = {"trace_id": "t", "ts": 1.0, "kind": "k", "node_name": "n", "node_id": "i"}
    for text in TRICKY_STRINGS:
        events.append(StoredEvent(**{**base, "payload": {text: text, "z": text, "a": [text]}}))
        events.append(
            StoredEvent(**{**base, "kind": text or "k", "node_name": text, "node_id": None, "payload": {}})
        )
        events.append(StoredEvent(**{**base, "trace_id": text, "payload": {"v": 1}}))
    for number in TRICKY_FLOATS:
        events.append(StoredEvent(**{**base, "ts": number, "payload": {"x": number, "l": [number, -number]}}))
    for number in TRICKY_INTS:
        events.append(StoredEvent(**{**base, "payload": {"n": number, "nested": {"m": [number]}}}))
    events.append(StoredEvent(**{**base, "ts": 1702857600, "payload": {"int_ts": True}}))
    events.append(StoredEvent(**{**base, "node_name": None, "node_id": None, "payload": {"b": 1, "a": 2}}))
    events.append(StoredEvent(**{**base, "payload": {"z": {"y": {"x": [{"w": 1, "v": 2}]}}, "a": []}}))
    events.append(StoredEvent(**{**base, "payload": {"é": 1, "e": 2, "E": 3, "🐧": 4, "\ue000": 5, "~": 6}}))
    # Values the strict codec normalises: tuples, other mappings, enums, subclasses.
    events.append(StoredEvent(**{**base, "payload": {"t": (1, 2, (3,)), "c": Color.RED, "m": Mood.HAPPY}}))
    events.append(StoredEvent(**{**base, "payload": types.MappingProxyType({"b": 1, "a": (2,)})}))
    events.append(StoredEvent(**{**base, "payload": OrderedDict([("b", Label("x")), ("a", Ratio(0.5))])}))
    events.append(StoredEvent(**{**base, "payload": {"deep": [[[[[[[[[[{"k": "v"}]]]]]]]]]]}}))
    nested: Any = "bottom"
    for level in range(200):
        nested = {f"l{level}": nested, "a": level}
    events.append(StoredEvent(**{**base, "payload": nested}))
    events.append(
        types.SimpleNamespace(
            trace_id=Label("ns"),
            ts=Ratio(2.5),
            kind=Label("kind"),
            node_name=None,
            node_id=Label("id"),
            payload={"duck": "typed"},
        )
    )
    rng = random.Random(15_7)
    for index in range(300):
        events.append(
            StoredEvent(
                trace_id=rng.choice([None, f"trace-{index % 11}", rng.choice(TRICKY_STRINGS)]),
                ts=rng.choice(TRICKY_FLOATS) if rng.random() < 0.3 else 1_700_000_000 + rng.random() * 1e7,
                kind=rng.choice(["node_start", "node_success", "node_error", "é", "x\x00y"]),
                node_name=rng.choice([None, "llm", rng.choice(TRICKY_STRINGS)]),
                node_id=rng.choice([None, f"id-{index}", rng.choice(TRICKY_STRINGS)]),
                payload=_random_mapping(rng, 0),
            )
        )
    return events


def refused_events() -> list[Any]:
    """Events ``encode_event`` refuses (the pins keep the path and reason)."""
    base: dict[str, Any] = {"trace_id": "t", "ts": 1.0, "kind": "k", "node_name": "n", "node_id": "i"}
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    return [
        StoredEvent(**{**base, "payload": {"x": float("nan")}}),
        StoredEvent(**{**base, "payload": {"x": [1, float("inf")]}}),
        StoredEvent(**{**base, "payload": {"x": {"y": -float("inf")}}}),
        StoredEvent(**{**base, "payload": {"x": "lone \ud800 surrogate"}}),
        StoredEvent(**{**base, "payload": {"lone \udfff key": 1}}),
        StoredEvent(**{**base, "payload": {1: "int key"}}),
        StoredEvent(**{**base, "payload": {"x": object()}}),
        StoredEvent(**{**base, "payload": {"x": {1, 2}}}),
        StoredEvent(**{**base, "payload": {"x": b"bytes"}}),
        StoredEvent(**{**base, "payload": {"x": 10**5000}}),
        StoredEvent(**{**base, "payload": cycle}),
        StoredEvent(**{**base, "payload": ["not", "a", "mapping"]}),
        StoredEvent(**{**base, "payload": None}),
        StoredEvent(**{**base, "ts": float("nan"), "payload": {}}),
        StoredEvent(**{**base, "ts": True, "payload": {}}),
        StoredEvent(**{**base, "ts": "1.0", "payload": {}}),
        StoredEvent(**{**base, "ts": 10**400, "payload": {}}),
        StoredEvent(**{**base, "kind": None, "payload": {}}),
        StoredEvent(**{**base, "kind": "\ud800", "payload": {}}),
        StoredEvent(**{**base, "trace_id": 5, "payload": {}}),
        StoredEvent(**{**base, "node_id": b"x", "payload": {}}),
        types.SimpleNamespace(trace_id="t", ts=1.0, kind="k", node_name=None, payload={}),
    ]
