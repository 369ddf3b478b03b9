"""The stale-if-error cache is bounded in bytes: an estimate per value, LRU
eviction by bytes and entries, values too large to hold not kept, a gauge of the bytes held."""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from guarded.config import StaleConfig, build_config
from guarded.layers.stale_reads import LARGEST_SHARE, SAMPLE, VISITS, StaleCache, estimate_size
from guarded.models import StoredEvent


def _text(length: int) -> str:
    return "x" * length


def test_eviction_by_bytes_is_least_recently_used() -> None:
    size = estimate_size(_text(1000))
    cache = StaleCache(1000, max_bytes=LARGEST_SHARE * size, registry=CollectorRegistry())
    keys = [f"k{index}" for index in range(LARGEST_SHARE)]
    for key in keys:  # exactly max_bytes
        cache.put(key, _text(1000))
    assert cache.bytes == LARGEST_SHARE * size
    assert cache.get("k0") == _text(1000)  # now the most recently used
    cache.put("new", _text(1000))
    assert "k1" not in cache  # the least recently used went, not the oldest put
    assert "k0" in cache
    assert cache.bytes == LARGEST_SHARE * size
    cache.put("newer", _text(1000))
    assert "k2" not in cache
    cache.put("k0", _text(500))  # a smaller value for a key: its old size is given back
    assert cache.bytes == (LARGEST_SHARE - 1) * size + estimate_size(_text(500))
    assert len(cache) == LARGEST_SHARE


def test_the_entries_bound_still_holds() -> None:
    cache = StaleCache(2, registry=CollectorRegistry())
    for key in "abc":
        cache.put(key, {"k": key})
    assert len(cache) == 2
    assert "a" not in cache
    assert cache.bytes == 2 * estimate_size({"k": "b"})


def test_a_value_above_an_eighth_of_the_bound_is_not_kept_and_drops_the_older_one() -> None:
    cache = StaleCache(100, max_bytes=8_000, registry=CollectorRegistry())
    cache.put("small", _text(10))
    cache.put("history", [_text(10)] * 3)
    assert "history" in cache
    cache.put("history", [_text(100)] * 100)  # ~17 kB: above 1,000 bytes
    assert "history" not in cache  # not the older answer either: it is no longer the last one read
    assert "small" in cache
    assert cache.bytes == estimate_size(_text(10))


def test_replacing_and_discarding_keep_the_byte_count_exact() -> None:
    cache = StaleCache(100, registry=CollectorRegistry())
    cache.put("k", _text(10))
    cache.put("k", _text(500))
    assert cache.bytes == estimate_size(_text(500))
    cache.discard("k")
    cache.discard("k")
    assert cache.bytes == 0
    assert len(cache) == 0


def test_a_state_put_again_unchanged_is_not_measured_again_but_a_changed_one_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import guarded.layers.stale_reads as stale_module

    measured: list[object] = []
    real = stale_module.estimate_size

    def counting(value: Any) -> int:
        measured.append(value)
        return real(value)

    monkeypatch.setattr(stale_module, "estimate_size", counting)
    cache = StaleCache(10, max_bytes=1 << 20, registry=CollectorRegistry())
    cache.put("a", {"summary": "short"})
    cache.put("b", {"summary": "other"})
    held = cache.bytes
    cache.put("a", {"summary": "short"})  # read back: an equal, fresh dict
    assert len(measured) == 2
    assert cache.bytes == held
    assert list(cache._values) == ["b", "a"], "still the most recently used"
    cache.put("a", {"summary": "x" * 10_000})  # same keys, grown: measured again
    assert len(measured) == 3
    assert cache.bytes >= held + 9_000


def test_zero_bounds_keep_nothing() -> None:
    for cache in (
        StaleCache(0, registry=CollectorRegistry()),
        StaleCache(10, max_bytes=0, registry=CollectorRegistry()),
    ):
        cache.put("k", "v")
        assert "k" not in cache
        assert cache.bytes == 0


def test_the_bytes_held_are_exported_per_store() -> None:
    registry = CollectorRegistry()
    cache = StaleCache(10, store_name="primary", registry=registry)
    other = StaleCache(10, store_name="other", registry=registry)
    cache.put("k", {"turns": ["a", "b"]})
    other.put("k", _text(100))
    assert registry.get_sample_value("guarded_stale_cache_bytes", {"store": "primary"}) == cache.bytes > 0
    assert registry.get_sample_value("guarded_stale_cache_bytes", {"store": "other"}) == other.bytes
    assert registry.get_sample_value("guarded_stale_cache_entries", {"store": "primary"}) == 1


def test_max_bytes_is_configured_by_stale_config_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert StaleConfig().max_bytes == 64 * 1024 * 1024
    monkeypatch.setenv("GUARDED_STALE__MAX_BYTES", "1048576")
    assert build_config(None, {}).stale.max_bytes == 1_048_576


class _Counted:
    """An object that counts how often its size is asked for."""

    asked = 0
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __sizeof__(self) -> int:
        _Counted.asked += 1
        return 100


def test_a_long_list_is_sized_from_a_sample() -> None:
    _Counted.asked = 0
    values = [_Counted(index) for index in range(100_000)]
    estimate = estimate_size(values)
    assert _Counted.asked == SAMPLE
    item = sys.getsizeof(values[0]) + sys.getsizeof(12_345)
    assert estimate == pytest.approx(sys.getsizeof(values) + len(values) * item, rel=0.01)


def test_the_walk_is_bounded_for_any_shape() -> None:
    _Counted.asked = 0
    nested: Any = [_Counted(0) for _ in range(SAMPLE)]
    for _ in range(10):
        nested = [nested] * SAMPLE  # SAMPLE ** 11 leaves if walked whole
    estimate_size(nested)
    assert _Counted.asked <= VISITS
    cycle: list[Any] = []
    cycle.append(cycle)
    assert estimate_size(cycle) > 0


def _held_by(build: Any) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    try:
        value = build()
        gc.collect()
        return value, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _history(count: int) -> list[StoredEvent]:
    # The shape a PostgreSQL load_history returns: payloads decoded by one json.loads.
    payloads = json.loads(
        "["
        + ",".join(
            json.dumps({"event": "node_success", "latency_ms": 1523.45 + i, "attempt": 1, "node_id": f"n{i}"})
            for i in range(count)
        )
        + "]"
    )
    return [
        StoredEvent(
            trace_id="t",
            ts=1.7e9 + i,
            kind=f"node_success{i % 3}",
            node_name=f"llm{i}",
            node_id=None,
            payload=p,
        )
        for i, p in enumerate(payloads)
    ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: _history(20_000),
        lambda: {f"turn-{i}": {"role": "user", "text": f"message {i} " * 5, "n": i} for i in range(2_000)},
        lambda: {"summary": "é" * 5_000, "facts": [f"fact {i}" for i in range(500)], "turns": 7},
    ],
    ids=["history", "wide memory", "memory with text"],
)
def test_the_estimate_is_within_a_factor_of_what_tracemalloc_sees(build: Any) -> None:
    value, held = _held_by(build)
    ratio = estimate_size(value) / held
    assert 0.5 <= ratio <= 3, ratio


operations = st.lists(
    st.tuples(st.sampled_from(["put", "get", "discard"]), st.integers(0, 7), st.integers(0, 3_000)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(1, 6), st.integers(0, 40_000))
def test_the_cache_is_a_least_recently_used_map_under_both_bounds(
    steps: list[tuple[str, int, int]], max_entries: int, max_bytes: int
) -> None:
    """Against a model: an ordered map, most recently used last, trimmed from the front; after
    every step the cache holds the model's keys (so it evicted the ones the model did) and their
    estimated bytes."""
    cache = StaleCache(max_entries, max_bytes=max_bytes, registry=CollectorRegistry())
    model: OrderedDict[int, str] = OrderedDict()
    for operation, key, length in steps:
        if operation == "put":
            value = _text(length)
            model.pop(key, None)
            if estimate_size(value) <= max_bytes // LARGEST_SHARE:
                model[key] = value
                while len(model) > max_entries or sum(map(estimate_size, model.values())) > max_bytes:
                    model.popitem(last=False)
            cache.put(key, value)
        elif operation == "get":
            assert cache.get(key) == model.get(key)
            if key in model:
                model.move_to_end(key)
        else:
            cache.discard(key)
            model.pop(key, None)
        assert [k for k in range(8) if k in cache] == sorted(model)
        assert cache.bytes == sum(map(estimate_size, model.values()))


def test_a_list_of_learned_records_is_sized_as_the_general_walk_sizes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import guarded.layers.stale_reads as stale

    shortcut = stale._records_of_known_size
    taken: list[int] = []

    def counted(items: list[Any]) -> int | None:
        found = shortcut(items)
        if found is not None:
            taken.append(found)
        return found

    monkeypatch.setattr(stale, "_records_of_known_size", counted)

    class Record:
        __slots__ = ("name", "payload")

        def __init__(self, index: int) -> None:
            self.payload = {"index": index, "text": "x" * (index % 7)}
            self.name = f"record-{index}"

    def general(value: Any) -> int:
        return sys.getsizeof(value) + sum(stale._item_size(item, [VISITS], 1) for item in value)

    shortcut_answers: list[int] = []
    general_answers: list[int] = []
    measured_before = 0
    for index in range(300):
        records = [Record(index + offset) for offset in range(1 + index % SAMPLE)]
        learned = stale._learned.get(Record)
        expected_counts = None if learned is None else list(learned)
        shortcut_answers.append(estimate_size(records))
        after = list(stale._learned[Record])
        stale._learned[Record] = expected_counts if expected_counts is not None else [0, 0, 0]
        if expected_counts is None:
            del stale._learned[Record]
        general_answers.append(general(records))
        assert stale._learned[Record] == after  # the same bookkeeping: seen, measured, total
        measured_before = after[1]
    assert shortcut_answers == general_answers
    assert len(taken) > 200  # the shortcut answered most of them
    assert measured_before > stale.LEARN  # records were measured again now and then (RELEARN)
    mixed = [Record(1), Record(2), "not a record"]
    assert estimate_size(mixed) == general(mixed)
