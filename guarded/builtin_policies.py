"""The policy table's entries, as data (the policy table is data): every method of the
StateStore, ArtifactStore and SnapshotStore protocols as a :class:`~guarded.policy.MethodPolicy`
(the only place that names methods), the lifecycle methods passed through unguarded, and the
legacy aliases. :class:`~guarded.policy_table.PolicyTable` builds its tables from them."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from .policy import (
    ArgGetter,
    Argument,
    Fallback,
    Ids,
    Kind,
    LocalFallback,
    Merge,
    MethodPolicy,
    arg,
    attr_of,
    reads_of,
)
from .protocol import LEGACY_ALIASES


def _key(*getters: ArgGetter) -> ArgGetter:
    """A key made of what ``getters`` read (a tuple), read on every keyed write: in one step from
    the usual call's arguments when the getters read arguments (:func:`_direct_key`)."""
    general = _general_key(*getters)
    return _direct_key(getters, general) or general


def _direct_key(getters: tuple[ArgGetter, ...], general: ArgGetter) -> ArgGetter | None:
    """``general`` with the usual calls answered in one step (:mod:`operator`'s getters, in C), when
    every getter reads an argument (:func:`~guarded.policy.arg`) or every getter an attribute of the
    same argument (:func:`~guarded.policy.attr_of`): a call with all its arguments positional, or
    all by keyword. Anything else, a missing argument or attribute included, is ``general``'s to
    answer. ``None`` for other getters."""
    reads = [reads_of(getter) for getter in getters]
    known = [read for read in reads if read is not None]
    if len(known) != len(reads) or len(known) < 2:
        return None
    names = [name for name, _, _ in known]
    positions = [position for _, position, _ in known]
    attributes = [attribute for _, _, attribute in known]
    top = max(positions)
    if all(attribute is None for attribute in attributes):
        by_position, by_name = operator.itemgetter(*positions), operator.itemgetter(*names)

        def from_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
            if not kwargs and len(args) > top:
                return by_position(args)  # type: ignore[no-any-return]
            if not args:
                try:
                    return by_name(kwargs)  # type: ignore[no-any-return]
                except KeyError:
                    pass
            return general(args, kwargs)  # type: ignore[no-any-return]

        return from_arguments
    fields = [attribute for attribute in attributes if attribute is not None]
    if len(fields) != len(attributes) or len(set(positions)) != 1 or len(set(names)) != 1:
        return None
    read = operator.attrgetter(*fields)

    def from_one_argument(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        if not kwargs and len(args) > top:
            try:
                return read(args[top])
            except AttributeError:
                pass
        return general(args, kwargs)  # type: ignore[no-any-return]

    return from_one_argument


def _general_key(*getters: ArgGetter) -> ArgGetter:
    """The key of any call, getter by getter (the usual calls are :func:`_direct_key`'s)."""

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


def state_store_policies() -> list[MethodPolicy]:
    """The entries of the StateStore methods (a legacy name is no entry: see :data:`ALIASES`)."""
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
        MethodPolicy("list_memory_keys", Kind.READ, Fallback.EMPTY_LIST, ids=Ids(session_id=_session_arg)),
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
            ordered_by_data=True,
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


def artifact_store_policies() -> list[MethodPolicy]:
    """The entries of the ArtifactStore methods, each saying what it does with the copies kept in
    process (:class:`~guarded.policy.LocalFallback`)."""
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


def snapshot_store_policies() -> list[MethodPolicy]:
    """The entries of the SnapshotStore methods, and the one of :data:`SNAPSHOT_ANSWERS`."""

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


__all__ = [
    "ALIASES",
    "LIFECYCLE_METHODS",
    "SNAPSHOT_ANSWERS",
    "artifact_store_policies",
    "snapshot_store_policies",
    "state_store_policies",
]
