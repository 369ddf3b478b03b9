"""The policy table: what every StateStore method is, as data (DESIGN.md "The policy table is data").

Layers read a method's :class:`MethodPolicy`; none of them special-cases method names. Unknown
async methods of a custom backend get a policy inferred from their name (:func:`infer_policy`),
and users can override any entry or add methods through :class:`PolicyTable`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from .protocol import LEGACY_ALIASES

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
    """The safe default a failed call returns (DESIGN.md "fallback")."""

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


def arg(name: str, index: int) -> ArgGetter:
    """Read argument ``name`` passed by keyword or at position ``index``; ``None`` when absent."""

    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if len(args) > index else None

    return get


def attr_of(name: str, index: int, attribute: str) -> ArgGetter:
    """Read ``attribute`` of argument ``name`` (by keyword or position ``index``)."""

    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if name in kwargs:
            return getattr(kwargs[name], attribute, None)
        return getattr(args[index], attribute, None) if len(args) > index else None

    return get


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
    """An argument checked before a call enters the chain (:mod:`guarded.pipeline.call_check`): a wrong
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
    """Semantics of one store method (DESIGN.md policy table).

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


def _key(*getters: ArgGetter) -> ArgGetter:
    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(getter(args, kwargs) for getter in getters)

    return get


_event_trace = attr_of("event", 0, "trace_id")
_binding = "binding"
_state_task = attr_of("state", 0, "task_id")
_state_session = attr_of("state", 0, "session_id")
_update_session = attr_of("update", 0, "session_id")
_update_task = attr_of("update", 0, "task_id")
_steer_session = attr_of("event", 0, "session_id")
_steer_task = attr_of("event", 0, "task_id")
_trace_arg = arg("trace_id", 0)
_session_arg = arg("session_id", 0)


def _policies() -> list[MethodPolicy]:
    binding_key = _key(
        attr_of(_binding, 0, "trace_id"), attr_of(_binding, 0, "context_id"), attr_of(_binding, 0, "task_id")
    )
    return [
        MethodPolicy(
            "save_event",
            Kind.APPEND,
            dead_letter=True,
            batch=True,
            scope_key=_event_trace,
            value=arg("event", 0),
            ids=Ids(trace_id=_event_trace),
            arguments=(Argument("event", 0, "StoredEvent"),),
            bulk_form="save_events",
            bulk_item=("event",),
        ),
        MethodPolicy(
            "save_events",
            Kind.APPEND,
            dead_letter=True,
            ids=Ids(),
            arguments=(Argument("events", 0, "StoredEvent", many=True),),
        ),
        MethodPolicy(
            "load_history",
            Kind.READ,
            Fallback.EMPTY_LIST,
            scope_key=_trace_arg,
            merge_from="save_event",
            merge=Merge.LIST,
            ids=Ids(trace_id=_trace_arg),
        ),
        MethodPolicy(
            "save_remote_binding",
            Kind.UPSERT,
            dead_letter=True,
            lww_key=binding_key,
            ids=Ids(trace_id=attr_of(_binding, 0, "trace_id"), task_id=attr_of(_binding, 0, "task_id")),
            arguments=(Argument(_binding, 0, "RemoteBinding"),),
            bulk_form="save_remote_bindings",
            bulk_item=(_binding,),
        ),
        MethodPolicy(
            "mark_binding_terminal",
            Kind.UPSERT,
            dead_letter=True,
            lww_key=_key(arg("trace_id", 0), arg("context_id", 1), arg("task_id", 2)),
            ids=Ids(trace_id=arg("trace_id", 0), task_id=arg("task_id", 2)),
            bulk_form="mark_bindings_terminal",
            bulk_item=("trace_id", "context_id", "task_id"),
        ),
        MethodPolicy(
            "find_binding", Kind.READ, single_item=True, ids=Ids(session_id=arg("router_session_id", 0))
        ),
        MethodPolicy(
            "list_bindings", Kind.READ, Fallback.EMPTY_LIST, ids=Ids(session_id=arg("router_session_id", 0))
        ),
        MethodPolicy(
            "save_planner_state",
            Kind.UPSERT,
            critical=True,
            dead_letter=True,
            lww_key=arg("token", 0),
            value=arg("payload", 1),
            arguments=(Argument("payload", 1, "mapping"),),
            bulk_form="save_planner_states",
            bulk_item=("token", "payload"),
        ),
        MethodPolicy(
            "load_planner_state",
            Kind.CONSUME,
            repeat_safe=False,
            single_item=True,
            merge_from="save_planner_state",
            merge=Merge.TAKE,
            read_key=arg("token", 0),
        ),
        MethodPolicy(
            "save_memory_state",
            Kind.UPSERT,
            dead_letter=True,
            lww_key=arg("key", 0),
            value=arg("state", 1),
            arguments=(Argument("state", 1, "mapping"),),
            bulk_form="save_memory_states",
            bulk_item=("key", "state"),
            memory_health=True,
        ),
        MethodPolicy(
            "load_memory_state",
            Kind.READ,
            single_item=True,
            merge_from="save_memory_state",
            merge=Merge.LATEST,
            read_key=arg("key", 0),
            memory_health=True,
        ),
        MethodPolicy(
            "save_task",
            Kind.UPSERT,
            dead_letter=True,
            lww_key=_state_task,
            scope_key=_state_session,
            value=arg("state", 0),
            ids=Ids(session_id=_state_session, task_id=_state_task, trace_id=attr_of("state", 0, "trace_id")),
            arguments=(Argument("state", 0, "TaskState"),),
            bulk_form="save_tasks",
            bulk_item=("state",),
        ),
        MethodPolicy(
            "list_tasks",
            Kind.READ,
            Fallback.EMPTY_LIST,
            scope_key=_session_arg,
            merge_from="save_task",
            merge=Merge.LIST,
            merge_id="task_id",
            ids=Ids(session_id=_session_arg),
        ),
        MethodPolicy(
            "save_update",
            Kind.APPEND,
            dead_letter=True,
            batch=True,
            scope_key=_update_session,
            value=arg("update", 0),
            ids=Ids(
                session_id=_update_session, task_id=_update_task, trace_id=attr_of("update", 0, "trace_id")
            ),
            arguments=(Argument("update", 0, "StateUpdate"),),
            bulk_form="save_updates",
            bulk_item=("update",),
            ordered=True,
        ),
        MethodPolicy(
            "list_updates",
            Kind.READ,
            Fallback.EMPTY_LIST,
            scope_key=_session_arg,
            merge_from="save_update",
            merge=Merge.LIST,
            merge_id="update_id",
            ids=Ids(session_id=_session_arg, task_id=arg("task_id", 99)),
        ),
        MethodPolicy(
            "save_steering",
            Kind.APPEND,
            dead_letter=True,
            scope_key=_steer_session,
            value=arg("event", 0),
            ids=Ids(session_id=_steer_session, task_id=_steer_task, trace_id=attr_of("event", 0, "trace_id")),
            arguments=(Argument("event", 0, "SteeringEvent"),),
        ),
        MethodPolicy(
            "list_steering",
            Kind.READ,
            Fallback.EMPTY_LIST,
            scope_key=_session_arg,
            merge_from="save_steering",
            merge=Merge.LIST,
            merge_id="event_id",
            ids=Ids(session_id=_session_arg, task_id=arg("task_id", 99)),
        ),
        MethodPolicy(
            "save_trajectory",
            Kind.UPSERT,
            dead_letter=True,
            lww_key=_key(arg("trace_id", 0), arg("session_id", 1)),
            value=arg("trajectory", 2),
            ids=Ids(trace_id=arg("trace_id", 0), session_id=arg("session_id", 1)),
            arguments=(Argument("trajectory", 2, "trajectory"),),
            bulk_form="save_trajectories",
            bulk_item=("trace_id", "session_id", "trajectory"),
        ),
        MethodPolicy(
            "get_trajectory",
            Kind.READ,
            single_item=True,
            merge_from="save_trajectory",
            merge=Merge.LATEST,
            read_key=_key(arg("trace_id", 0), arg("session_id", 1)),
            ids=Ids(trace_id=arg("trace_id", 0), session_id=arg("session_id", 1)),
        ),
        MethodPolicy("list_traces", Kind.READ, Fallback.EMPTY_LIST, ids=Ids(session_id=_session_arg)),
        MethodPolicy(
            "save_planner_event",
            Kind.APPEND,
            dead_letter=True,
            batch=True,
            scope_key=_trace_arg,
            value=arg("event", 1),
            ids=Ids(trace_id=_trace_arg),
            arguments=(Argument("event", 1, "PlannerEvent"),),
            bulk_form="save_planner_events",
            bulk_item=("trace_id", "event"),
            ordered=True,
            item_keys=True,
        ),
        MethodPolicy(
            "list_planner_events",
            Kind.READ,
            Fallback.EMPTY_LIST,
            scope_key=_trace_arg,
            merge_from="save_planner_event",
            merge=Merge.LIST,
            ids=Ids(trace_id=_trace_arg),
        ),
    ]


LIFECYCLE_METHODS = frozenset(
    {
        "close",
        "aclose",
        "connect",
        "from_pool",
        "open",
        "start",
        "stop",
        "shutdown",
        "migrate",
        "migration_status",
        "sample_table_stats",
        "cleanup",
        "flush",
    }
)
"""Async methods that manage the store rather than use it (opening, migrating, operator and
metrics tooling): passed through unguarded, so their errors and duration stay visible to the code
that calls them."""

ALIASES: Mapping[str, str] = LEGACY_ALIASES
"""Legacy names (spec 000 "Compatibility Adapters"): each takes its target's policy."""


def _artifact_policies() -> list[MethodPolicy]:
    put, read = LocalFallback.PUT, LocalFallback.READ
    return [
        MethodPolicy("put_bytes", Kind.UPSERT, value=arg("data", 0), local_fallback=put),
        MethodPolicy("put_text", Kind.UPSERT, value=arg("text", 0), local_fallback=put),
        MethodPolicy("get", Kind.READ, single_item=True, local_fallback=read),
        MethodPolicy("get_ref", Kind.READ, single_item=True, local_fallback=read),
        MethodPolicy("exists", Kind.READ, Fallback.FALSE, local_fallback=read),
        MethodPolicy("list", Kind.READ, Fallback.EMPTY_LIST, local_fallback=LocalFallback.LIST),
        MethodPolicy("delete", Kind.DELETE, Fallback.FALSE, local_fallback=LocalFallback.DELETE),
    ]


SNAPSHOT_ANSWERS = "snapshot_answers"
"""The key space of the answers the guarded reads of a SnapshotStore keep for stale-if-error: no
method of that name is ever called (a snapshot read's ``merge_from``; nothing is held for it)."""


def _answer_key(method: str, *getters: ArgGetter) -> ArgGetter:
    """A snapshot read's stale-cache key: its method name and its arguments."""

    def get(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        return (method, *(getter(args, kwargs) for getter in getters))

    return get


def _listing_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    return ("list", args, tuple(sorted(kwargs.items())))


def _snapshot_policies() -> list[MethodPolicy]:
    def stale_read(name: str, key: ArgGetter) -> MethodPolicy:
        return MethodPolicy(name, Kind.READ, merge_from=SNAPSHOT_ANSWERS, merge=Merge.LATEST, read_key=key)

    snapshot_id = arg("snapshot_id", 0)
    return [
        # What the stale reads remember: never called, never held.
        MethodPolicy(SNAPSHOT_ANSWERS, Kind.UPSERT, value=arg("answer", 1)),
        # A save is idempotent (same id, same content hash), so a retry is safe. One the backend
        # cannot take is staged on local disk and held as save(snapshot_id, content_hash):
        # the dead-letter buffer keeps JSON arguments, a content is streams and blobs.
        MethodPolicy("save", Kind.UPSERT, staged=True),
        # A content streams from the backend after load returns: nothing to serve stale.
        MethodPolicy("load", Kind.READ),
        stale_read("get", _answer_key("get", snapshot_id)),
        stale_read("list", _listing_key),
        stale_read("lineage", _answer_key("lineage", snapshot_id)),
        stale_read("diff", _answer_key("diff", arg("a", 0), arg("b", 1))),
        # Adding or removing tags twice leaves what once did.
        MethodPolicy("tag", Kind.UPSERT),
        MethodPolicy("untag", Kind.UPSERT),
        # A repeat answers differently (a delete whose answer was lost says False the second time;
        # gc deletes by the time it runs): never retried blindly, never held.
        MethodPolicy("delete", Kind.DELETE, repeat_safe=False),
        MethodPolicy("gc", Kind.DELETE, repeat_safe=False),
    ]


_WRITE_PREFIXES = ("save_", "put_", "set_", "mark_", "delete_", "upsert_", "append_", "add_", "update_")
_READ_PREFIXES = ("load_", "get_", "list_", "find_", "exists", "fetch_", "read_", "count_", "has_")


def infer_policy(name: str) -> MethodPolicy:
    """Policy for a method the table does not know, from its name.

    ``save_/put_/set_/mark_/delete_...`` are writes (upserts: repeat-safe, no dead-letter without an
    explicit entry); ``load_/get_/list_/find_/exists...`` reads (``list_`` falls back to ``[]``,
    ``exists`` to ``False``). Anything else is treated as a non-repeatable write: never retried
    blindly, and its fallback is ``None``.
    """
    if name.startswith(("delete_", "remove_")):
        return MethodPolicy(name, Kind.DELETE, inferred=True)
    if name.startswith(_WRITE_PREFIXES):
        return MethodPolicy(name, Kind.UPSERT, inferred=True)
    if name.startswith(("list_", "find_all", "fetch_all")):
        return MethodPolicy(name, Kind.READ, Fallback.EMPTY_LIST, inferred=True)
    if name.startswith(("exists", "has_")):
        return MethodPolicy(name, Kind.READ, Fallback.FALSE, inferred=True)
    if name.startswith(_READ_PREFIXES):
        return MethodPolicy(name, Kind.READ, single_item=True, inferred=True)
    return MethodPolicy(name, Kind.UPSERT, repeat_safe=False, inferred=True)


class PolicyTable:
    """Policies by method name: the built-in table, legacy aliases, user overrides, inference."""

    def __init__(
        self, policies: Mapping[str, MethodPolicy], aliases: Mapping[str, str] | None = None
    ) -> None:
        self._policies = dict(policies)
        self._aliases = dict(aliases or {})

    @classmethod
    def for_state_store(cls) -> PolicyTable:
        """The table of every StateStore method (DESIGN.md), plus the ArtifactStore methods for
        stores that implement that protocol directly."""
        return cls({policy.name: policy for policy in [*_artifact_policies(), *_policies()]}, ALIASES)

    @classmethod
    def for_artifact_store(cls) -> PolicyTable:
        """The table of the ArtifactStore methods of a guarded store's ``artifact_store``: a put the
        backend cannot take is dead-lettered (kept in process and held for replay, see
        :mod:`guarded.layers.artifact_fallback`)."""
        return cls(
            {
                policy.name: replace(policy, dead_letter=policy.local_fallback is LocalFallback.PUT)
                for policy in _artifact_policies()
            }
        )

    @classmethod
    def for_snapshot_store(cls) -> PolicyTable:
        """The table of the :class:`~guarded.snapshots.SnapshotStore` methods
        (:func:`guarded.snapshots.guarded.guard_snapshots`): ``save``, ``tag`` and ``untag`` retried
        (idempotent); a ``save`` the backend cannot take staged and held (:attr:`MethodPolicy.staged`);
        ``get``, ``list``, ``lineage`` and ``diff`` stale-if-error;
        ``load`` a plain read; ``delete`` and ``gc`` never retried blindly."""
        return cls({policy.name: policy for policy in _snapshot_policies()})

    def get(self, name: str) -> MethodPolicy:
        """The policy of ``name``: explicit entry, else its alias target's, else inferred."""
        policy = self._policies.get(name)
        if policy is not None:
            return policy
        target = self._aliases.get(name)
        if target is not None and target in self._policies:
            return replace(self._policies[target], name=name, alias_of=target)
        return infer_policy(name)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any] | MethodPolicy]) -> PolicyTable:
        """A copy with entries replaced (a full :class:`MethodPolicy`) or patched (a mapping of fields)."""
        table = PolicyTable(self._policies, self._aliases)
        for name, override in overrides.items():
            if isinstance(override, MethodPolicy):
                table._policies[name] = replace(override, name=name)
            else:
                base = self.get(name)
                patch = dict(override)
                for enum_field, enum_type in (("kind", Kind), ("fallback", Fallback)):
                    if isinstance(patch.get(enum_field), str):
                        patch[enum_field] = enum_type(patch[enum_field])
                if "kind" in patch and "repeat_safe" not in patch:
                    patch["repeat_safe"] = patch["kind"] is not Kind.CONSUME
                table._policies[name] = replace(base, **patch, inferred=False)
        return table

    def __iter__(self) -> Iterator[MethodPolicy]:
        """The table's own entries (not its aliases, nor inferred policies)."""
        return iter(self._policies.values())

    def merges_from(self, write: str) -> frozenset[Merge]:
        """How the reads of the table see the held writes of ``write`` (empty when none does)."""
        return frozenset(
            policy.merge
            for policy in self._policies.values()
            if policy.merge_from == write and policy.merge is not None
        )

    def __contains__(self, name: object) -> bool:
        return name in self._policies or name in self._aliases
