"""The stale-if-error cache: the last value this process read or wrote per key, bounded (LRU).

When the backend fails, a read answers from here (outcome ``stale``) instead of an empty
default: without it an outage makes a planner load "no memory" and then save an empty memory
over the real one.

**Bounded in entries and in bytes.** Values are live Python objects (a ``load_history`` answer is
a list of event records), so their size is estimated by :func:`estimate_size`, a bounded
sampling walk (its error is described there). The least recently used values go first once
either ``max_entries`` or ``max_bytes`` is exceeded. A value estimated above an eighth of
``max_bytes`` (8 MiB by default) is not kept at all, and the older value of its key is dropped
with it: one huge answer (a 100,000-event history, ~49 MB of objects) would otherwise push out
every memory state, which is what the cache is for, and an older value than the last one read
is not served.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from sys import getsizeof
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..observability import telemetry_names as names
from ..observability.store_gauge import store_total_gauge

_MISSING = object()

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Default of ``stale.max_bytes``."""
LARGEST_SHARE = 8
"""A value estimated above ``max_bytes // LARGEST_SHARE`` is not kept."""

SAMPLE = 16
"""Items of a container measured by :func:`estimate_size`; a larger one is extrapolated from them."""
VISITS = 1024
"""Objects :func:`estimate_size` measures at most per value (its cost bound)."""
_MAX_DEPTH = 64
_ATOMS = frozenset({str, int, float, bool, type(None), bytes, complex})
_STR_ASCII = getsizeof("")
"""An ASCII ``str`` takes this plus one byte per character."""
_STR_WIDE = getsizeof("\U0001f427") - 4
"""Any other ``str`` at most this plus four bytes per character (counted so: errs high)."""
_SMALL_INT = 2**30
_INT_SIZE = getsizeof(_SMALL_INT - 1)
"""An ``int`` of one 30-bit digit (small cached ones are shared: counted so, errs high)."""
_FIXED: dict[type, int] = {float: getsizeof(0.0), bool: 0, type(None): 0}
"""Sizes taken as constant: ``True``, ``False`` and ``None`` are shared singletons."""
_SEQUENCES = (list, tuple)
_COLLECTIONS = (set, frozenset)
_slot_names: dict[type, tuple[str, ...]] = {}
LEARN = 8
"""Instances of a class (a record: an event, a task) measured before the mean of their sizes
stands in for the next ones; records of one class have much the same shape, and measuring a
pydantic model walks every field (a list of tasks cost about 25 µs a read without this)."""
RELEARN = 1024
"""One instance in this many is measured again, so the mean follows what the records hold. A
measurement costs about 12 µs for a PenguiFlow update: at one in 64 it cost a read of three
records about 0.5 µs on average, at one in 1,024 about 0.04 µs."""
_learned: dict[type, list[int]] = {}
"""Per class: instances seen, instances measured, their total size."""


def estimate_size(value: Any) -> int:
    """An estimate of the bytes ``value`` and what it references take (``sys.getsizeof`` summed).

    Cheap by construction: at most :data:`SAMPLE` items of any container are measured (a list
    or tuple at evenly spaced indices, a mapping or set from its start) and the container's
    total is extrapolated from their mean; at most :data:`VISITS` objects are measured in all,
    after which a container is extrapolated from the items measured so far. A 100,000-event
    history costs about as much as 16 of its events (~0.1 ms), a small flat memory state about
    a microsecond.

    Objects of a class (records) are measured :data:`LEARN` times, then sized by the mean of
    what was measured (one in :data:`RELEARN` is measured again).

    Error: for trees of built-in containers, scalars and objects with ``__dict__`` or ``__slots__``,
    with no container sampled and no record sized by its class's mean, it is ``sys.getsizeof``
    summed except that a non-ASCII string is counted at four bytes a character and small integers,
    ``True``, ``False`` and ``None`` at a fixed size. Objects referenced several times (interned
    strings, small integers, dict keys shared by ``json.loads``, the same list in two places) are
    counted each time. So it errs high. A sampled container whose items differ in size errs by how
    far the sample's mean is from the whole's (for items of similar shape, such as events, a few per
    cent). Against ``tracemalloc`` (tests/test_stale_cache_bytes.py): 1.4x to 1.6x for a history
    decoded by one ``json.loads``, a wide memory state and one with non-ASCII text. Memory an object
    holds outside Python objects (a C buffer not reported by ``__sizeof__``) is not seen.
    """
    if type(value) is dict and len(value) <= SAMPLE:  # a memory state: no budget list, no call per item
        total = getsizeof(value)
        for key, item in value.items():
            total += _STR_ASCII + len(key) if type(key) is str and key.isascii() else _size(key, [VISITS], 1)
            kind = type(item)
            if kind is str:
                total += _STR_ASCII + len(item) if item.isascii() else _STR_WIDE + 4 * len(item)
            elif kind in _FIXED:
                total += _FIXED[kind]
            elif kind is int and -_SMALL_INT < item < _SMALL_INT:
                total += _INT_SIZE
            else:
                total += _size(item, [VISITS // SAMPLE], 1)
        return total
    if type(value) is list and 0 < len(value) <= SAMPLE:
        known = _records_of_known_size(value)
        if known is not None:
            return getsizeof(value) + known
    return _size(value, [VISITS], 0)


def _records_of_known_size(items: list[Any]) -> int | None:
    """The size of ``items`` when all are records of one class whose mean size is learned and none
    is due to be measured again (a list read's answer: tasks, updates); ``None`` otherwise. The
    same sum :func:`_size` gives, without a call per item."""
    kind = type(items[0])
    learned = _learned.get(kind)
    count = len(items)
    if learned is None or learned[1] < LEARN or learned[0] % RELEARN + count >= RELEARN:
        return None
    for item in items:
        if type(item) is not kind:
            return None
    learned[0] += count
    return count * (learned[2] // learned[1])


def _size(value: Any, budget: list[int], depth: int) -> int:
    budget[0] -= 1
    kind = type(value)
    if kind is str:
        return _str_size(value)
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return fixed
    size = getsizeof(value)
    if kind in _ATOMS or budget[0] <= 0 or depth >= _MAX_DEPTH:
        return size
    depth += 1
    count = measured = total = 0
    if kind is list or kind is tuple or (kind is not dict and isinstance(value, _SEQUENCES)):
        count = len(value)
        indices = range(count) if count <= SAMPLE else [i * count // SAMPLE for i in range(SAMPLE)]
        for index in indices:
            if measured and budget[0] <= 0:
                break
            item = value[index]
            if type(item) is str and item.isascii():  # _item_size, inlined for the usual item
                total += _STR_ASCII + len(item)
            else:
                total += _item_size(item, budget, depth)
            measured += 1
    elif kind is dict or isinstance(value, Mapping):
        count = len(value)
        for key, item in value.items():
            if measured == SAMPLE or (measured and budget[0] <= 0):
                break
            # _item_size, inlined for the usual key (ASCII text) and the usual scalar values.
            total += (
                _STR_ASCII + len(key)
                if type(key) is str and key.isascii()
                else _item_size(key, budget, depth)
            )
            item_kind = type(item)
            if item_kind is str and item.isascii():
                total += _STR_ASCII + len(item)
            elif item_kind in _FIXED:
                total += _FIXED[item_kind]
            else:
                total += _item_size(item, budget, depth)
            measured += 1
    elif isinstance(value, _COLLECTIONS):
        count = len(value)
        for item in value:
            if measured == SAMPLE or (measured and budget[0] <= 0):
                break
            total += _item_size(item, budget, depth)
            measured += 1
    else:
        learned = _learned.get(kind)
        if learned is None:
            learned = _learned[kind] = [0, 0, 0]
        learned[0] += 1
        if learned[1] >= LEARN and learned[0] % RELEARN:
            return learned[2] // learned[1]  # a record like the ones measured before
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            size += _size(attributes, budget, depth)
        for name in _slots_of(kind):
            item = getattr(value, name, _MISSING)
            if item is not _MISSING:
                size += _item_size(item, budget, depth)
        learned[1] += 1
        learned[2] += size
        return size
    return size + (total * count // measured if measured else 0)


def _item_size(item: Any, budget: list[int], depth: int) -> int:
    """:func:`_size` of an item, the common scalars without a call."""
    kind = type(item)
    if kind is str:
        length = len(item)
        return _STR_ASCII + length if item.isascii() else _STR_WIDE + 4 * length
    fixed = _FIXED.get(kind)
    return fixed if fixed is not None else _size(item, budget, depth)


def _str_size(value: str) -> int:
    length = len(value)
    return _STR_ASCII + length if value.isascii() else _STR_WIDE + 4 * length


def _slots_of(kind: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``kind`` and its bases (``__dict__`` and ``__weakref__`` left out)."""
    names_ = _slot_names.get(kind)
    if names_ is None:
        found: list[str] = []
        for klass in kind.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and name not in found:
                    found.append(name)
        names_ = _slot_names[kind] = tuple(found)
    return names_


def _unchanged(held: Any, value: dict[Any, Any]) -> bool:
    """Whether ``value``, a mapping, equals the one ``held`` (compared in C; a mapping whose items
    cannot be compared counts as changed)."""
    if held is value:
        return True
    if type(held) is not dict:
        return False
    try:
        return bool(held == value)
    except Exception:  # an item whose __eq__ raises
        return False


class StaleCache:
    """At most ``max_entries`` values by key and about ``max_bytes`` of them (see
    :func:`estimate_size`); the least recently used goes first.

    Its size is exported at scrape time in ``registry`` as ``guarded_stale_cache_entries{store}``
    and ``guarded_stale_cache_bytes{store}`` (the estimate).
    """

    def __init__(
        self,
        max_entries: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        store_name: str = "default",
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._max = max_entries
        self._max_bytes = max_bytes
        self._largest = max_bytes // LARGEST_SHARE
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._bytes = 0
        self.store_name = store_name
        target = REGISTRY if registry is None else registry
        store_total_gauge(target, names.STALE_ENTRIES, "Values held for stale-if-error reads.", len).add(self)
        store_total_gauge(
            target,
            names.STALE_BYTES,
            "Estimated bytes of the values held for stale-if-error reads.",
            lambda cache: cache.bytes,
        ).add(self)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def bytes(self) -> int:
        """The estimated size of the values held (the sum of their :func:`estimate_size`)."""
        return self._bytes

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._values.get(key, _MISSING)
        if value is _MISSING:
            return default
        self._values.move_to_end(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def put(self, key: Hashable, value: Any) -> None:
        """Hold ``value`` as the last one of ``key``, evicting the least recently used values
        beyond the bounds; a value too large to hold drops the older value of ``key``."""
        if self._max <= 0:
            return
        values = self._values
        if type(value) is dict and _unchanged(values.get(key, _MISSING), value):
            values[key] = value  # the same state read or written again: its size is known
            values.move_to_end(key)
            return
        size = estimate_size(value)
        if size > self._largest:
            self.discard(key)
            return
        self._bytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size
        values[key] = value
        values.move_to_end(key)
        while len(values) > self._max or self._bytes > self._max_bytes:
            evicted, _ = values.popitem(last=False)
            self._bytes -= self._sizes.pop(evicted)

    def discard(self, key: Hashable) -> None:
        if self._values.pop(key, _MISSING) is not _MISSING:
            self._bytes -= self._sizes.pop(key)
