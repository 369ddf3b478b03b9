"""What a store method is, as a record: :class:`MethodPolicy` and the vocabulary its fields are
written in (:class:`Kind`, :class:`Merge`, :class:`Fallback`, :class:`LocalFallback`, :class:`Ids`,
:class:`Argument`, and the argument getters :func:`arg` and :func:`attr_of`).

Layers read a method's :class:`MethodPolicy`; none of them special-cases method names. The policy
table's entries are data, in :mod:`guarded.builtin_policies`;
:class:`~guarded.policy_table.PolicyTable` looks them up, gives unknown async methods of a custom
backend a policy inferred from their name (:func:`~guarded.policy_table.infer_policy`), and lets
users override any entry or add methods.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

ArgGetter = Callable[[tuple[Any, ...], Mapping[str, Any]], Any]


class Kind(str, Enum):
    """What a method does to the store."""

    READ = "read"
    APPEND = "append"
    UPSERT = "upsert"
    CONSUME = "consume"
    """Reads and deletes (``load_planner_state``): a blind repeat can lose the item."""
    DELETE = "delete"


class Merge(str, Enum):
    """How a read combines the backend's answer with writes the guard still holds (batched or
    dead-lettered) for the same key or scope, and what it serves when the backend fails."""

    LIST = "list"
    """A list: held writes' values are added (replacing items with the same ``merge_id``)."""
    LATEST = "latest"
    """One value: the newest held write for the key wins (it is newer than the backend's)."""
    TAKE = "take"
    """A consume: a held write for the key is taken out of the buffer and returned."""


class Fallback(str, Enum):
    """The safe default a failed call returns."""

    NONE = "none"
    EMPTY_LIST = "empty_list"
    FALSE = "false"

    def value_factory(self) -> Callable[[], Any]:
        if self is Fallback.EMPTY_LIST:
            return list
        if self is Fallback.FALSE:
            return lambda: False
        return lambda: None


class LocalFallback(str, Enum):
    """What a guarded artifact store does with the copies it keeps in process (artifacts the
    backend could not take, :mod:`guarded.layers.artifact_fallback`)."""

    PUT = "put"
    """A write: kept in process (and held for replay) when the backend cannot take it."""
    READ = "read"
    """A read: answered from the copies kept in process first."""
    LIST = "list"
    """A listing: merged with the copies kept in process."""
    DELETE = "delete"
    """A delete: of the copy kept in process, and of a held put of it, too."""


_READS: weakref.WeakKeyDictionary[ArgGetter, tuple[str, int, str | None]] = weakref.WeakKeyDictionary()
"""What each getter made by :func:`arg` or :func:`attr_of` reads: (argument name, position,
attribute or ``None``); weakly, as every policy table makes getters of its own."""


def arg(name: str, index: int) -> ArgGetter:
    """Read argument ``name`` passed by keyword or at position ``index``; ``None`` when absent."""

    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if len(args) > index else None

    _READS[get] = (name, index, None)
    return get


def attr_of(name: str, index: int, attribute: str) -> ArgGetter:
    """Read ``attribute`` of argument ``name`` (by keyword or position ``index``)."""

    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name in kwargs:
            return getattr(kwargs[name], attribute, None)
        return getattr(args[index], attribute, None) if len(args) > index else None

    _READS[get] = (name, index, attribute)
    return get


def reads_of(getter: ArgGetter) -> tuple[str, int, str | None] | None:
    """What ``getter`` reads when :func:`arg` or :func:`attr_of` made it: (argument name,
    position, attribute or ``None``); ``None`` for any other getter."""
    return _READS.get(getter)


@dataclass(frozen=True, slots=True)
class Ids:
    """Where a call's PenguiFlow ids come from (span attributes only, never metric labels)."""

    trace_id: ArgGetter | None = None
    session_id: ArgGetter | None = None
    task_id: ArgGetter | None = None

    def extract(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, str]:
        found: dict[str, str] = {}
        for key, getter in (
            ("penguiflow.trace_id", self.trace_id),
            ("penguiflow.session_id", self.session_id),
            ("penguiflow.task_id", self.task_id),
        ):
            if getter is not None:
                value = getter(args, kwargs)
                if isinstance(value, str):
                    found[key] = value
        return found


@dataclass(frozen=True, slots=True)
class Argument:
    """An argument checked before a call enters the chain (:mod:`guarded.layers.call_check`): a wrong
    type is the caller's bug, rejected at once, never held or parked."""

    name: str
    index: int
    """Its position when passed positionally."""
    expects: str
    """A record type of :mod:`guarded.codec` (``"StoredEvent"``, ``"TaskState"`` ...), or
    ``"mapping"``, or ``"trajectory"`` (a mapping or an object with ``serialise()``)."""
    many: bool = False
    """A sequence (list or tuple) of them."""


@dataclass(frozen=True, slots=True)
class MethodPolicy:
    """Semantics of one store method.

    ``lww_key`` returns the last-write-wins key of an upsert (newer writes for the key supersede
    older ones); ``scope_key`` the trace or session a read or append belongs to (read-your-writes).
    """

    name: str
    kind: Kind
    fallback: Fallback = Fallback.NONE
    repeat_safe: bool = True
    critical: bool = False
    dead_letter: bool = False
    batch: bool = False
    single_item: bool = False
    """A read of one item: ``None`` means "not found" (outcome ``not_found``), not failure."""
    lww_key: ArgGetter | None = None
    scope_key: ArgGetter | None = None
    ids: Ids = field(default_factory=Ids)
    value: ArgGetter | None = None
    """Of a write: the argument carrying the written value (what a read of it returns)."""
    merge_from: str | None = None
    """Of a read: the write method whose held writes it sees (read-your-writes, stale-if-error)."""
    merge: Merge | None = None
    merge_id: str | None = None
    """With :attr:`Merge.LIST`: the attribute identifying an item (newer replaces older)."""
    read_key: ArgGetter | None = None
    """Of a single-value read: its key, equal to the ``lww_key`` of the write it reads."""
    alias_of: str | None = None
    inferred: bool = False
    arguments: tuple[Argument, ...] = ()
    """The arguments whose type is checked before the call enters the chain."""
    bulk_form: str | None = None
    """Of a write: the backend method that writes many of its calls at once, when the backend has
    it (``save_events``). Batch flushes, replays and drains use it. It takes one list, applied in
    list order (a later write of a last-write-wins key wins): of the call's argument when
    :attr:`bulk_item` names one parameter, else of tuples of the arguments it names, in order."""
    bulk_item: tuple[str, ...] = ()
    """The parameters of this method each item of :attr:`bulk_form` carries, in signature order."""
    ordered_by_data: bool = False
    """Of a last-write-wins upsert: the backend orders its writes by data they carry (a task state's
    ``updated_at``), not by the logical time of the call. An orphaned write of a key adopted from
    another process is then kept beside this process's writes of it, for the backend to decide."""
    ordered: bool = False
    """Of a batched append: its reads follow insertion order (a ``since_id`` cursor), so its
    batches are written one at a time, never concurrently."""
    item_keys: bool = False
    """Of an append without a natural id: each write gets a key of its own, kept with it when held,
    so a backend that honours keys stores it once even when an acknowledgement was lost."""
    memory_health: bool = False
    """The write (an upsert) or read of agent memory whose ``health`` the memory health gauge follows."""
    local_fallback: LocalFallback | None = None
    """Of an artifact store method: what it does with the copies kept in process."""
    staged: bool = False
    """Of a snapshot store's ``save``: a content the backend cannot take (an operational failure)
    is staged on local disk and its call -- JSON arguments naming the staged copy -- held in the
    dead-letter buffer and replayed (:mod:`guarded.snapshots.staging`). Not :attr:`dead_letter`:
    a content is not a JSON argument, and a save that cannot be staged is raised, never held."""
