"""PenguiFlow's reference store is the semantic oracle.

Random sequences of calls go, in the same order and with the same PenguiFlow model instances (as
PenguiFlow itself would pass them), to three stores:

* ``penguiflow``: PenguiFlow 3.11's own ``penguiflow.state.InMemoryStateStore``, the oracle;
* ``memory``: our :class:`guarded.backends.memory.InMemoryStateStore` (PenguiFlow's record types);
* ``postgres``: ``guard(PostgresStateStore)`` on a real embedded PostgreSQL (a fresh schema per
  sequence, PenguiFlow's record types);
* ``hybrid``: ``guard(HybridStateStore)`` with memory written through, its record store on the same
  PostgreSQL, in the first :data:`HYBRID_SEQUENCES` sequences.
* ``redis``: ``guard(RedisStateStore)`` on a real ``redis-server`` (a fresh key prefix per
  sequence, PenguiFlow's record types), in a test of its own with :data:`REDIS_SEQUENCES`
  sequences.

Every protocol method is called, the legacy aliases included (``save_task_update``,
``list_task_updates``, ``get_events``): the audit log (retried events, ``trace_id=None``), remote
bindings (``find_binding`` with and without tenant/user scopes, ``list_bindings``,
``mark_binding_terminal`` of known and unknown keys), pauses (each token loaded repeatedly:
consume once), memory, tasks (a task saved again under another session), updates and steering
(cursors: ``since_id`` known, unknown, empty or ``None``; ``task_id`` filters; ``limit`` default,
0, negative, small and large), steering payloads PenguiFlow sanitizes (``{"priority": True}``, a
``USER_MESSAGE`` with ``{"items": [1, 2]}``, long strings, long lists, many keys, deep nesting,
tuples, sets, frozensets, non-string nested keys, arbitrary objects, oversized ASCII and non-ASCII
payloads), trajectories (a trace saved again under another session) and planner events. Keys come
from small pools so that upserts, moves, cursors and filters collide often.

Every call's observable result (its return value, or the exception class it raised) must be equal
across the three stores. **Normalisations** (all are representation, not semantics):

1. Models and dataclasses are compared as ``{"__type__": class name, field: value, ...}``
   (pydantic ``model_dump()``, dataclass fields; a ``Trajectory`` as its ``serialise()``), so a
   fresh copy equals the oracle's instance, and the class is compared too (every store must return
   PenguiFlow's own classes).
2. Tuples compare as lists and enum members as ``(enum class, value)``: a durable store keeps JSON,
   which has no tuple; PenguiFlow's store hands back the tuple it was given inside a payload.

3. A task's empty ``progress`` (``{}``) equals ``None``: PenguiFlow's reference copies tasks with
   ``dict(progress) if progress else None``, so it hands back ``None`` for a saved ``{}``.

Nothing else is normalised: order, counts, ``None`` against ``[]``, timestamps and ids are compared
exactly.

**Exceptions** (ours deliberately differ; listed with their reasons in the README's "Using with
PenguiFlow" section). They are applied to the oracle by :class:`ReferenceWithExceptions` -- a
subclass of PenguiFlow's store that overrides exactly those behaviours -- and each is asserted
explicitly by a test of its own below (``test_exception_*``), against the plain oracle, so none is
silently skipped:

* E1 -- ``save_update`` / ``save_steering`` are idempotent by ``update_id`` / ``event_id`` within a
  session (spec 000: "Retries can re-emit the same update_id", "Steering events can be retried");
  PenguiFlow appends the duplicate, and ``guard()`` retries and replays writes.
* E2 -- a task saved under another session moves there (spec 000's schema: ``task_id`` is the
  primary key of ``task_states``); PenguiFlow leaves a stale copy listed under the old session.
* E3 -- steering payloads are sanitized to *strict* JSON: non-finite floats become their string form
  and lone surrogates U+FFFD; PenguiFlow keeps NaN (which PostgreSQL's ``json`` cannot store) and
  raises ``UnicodeEncodeError`` on a lone surrogate, losing the event.
* E4 -- under ``guard()`` a pause saved with the payload ``{}`` loads as ``None`` (the guard's
  consume normalisation, spec 000's "missing token" callout); PenguiFlow returns ``{}``.
* E5 -- an event saved with ``trace_id=None`` reads back with ``trace_id="__global__"``, the
  sentinel it is stored under (spec 000 ``save_event``); PenguiFlow hands back ``None``.
* E6 -- ``guard(PostgresStateStore)``'s ``save_task`` is last-write-wins by ``updated_at`` (a late
  replay never undoes a newer state); PenguiFlow's last call wins. The random calls stamp
  ``updated_at`` forward, as PenguiFlow's sessions do.

"Before" (the commit that added this test): 550 differences in the same 3,600 calls -- our stores
refused steering events PenguiFlow stores (``SteeringValidationError``; under ``guard()`` the
events were lost), ``limit`` 0 / negative read as "none", ``list_traces`` dropped a trace saved
later under another session, plus E1-E6.

Size: :data:`SEQUENCES` sequences of :data:`CALLS_PER_SEQUENCE` calls, i.e. 3,600 random calls,
each made against the three stores (10,800 store calls), from fixed seeds (set
``GUARDED_DIFFERENTIAL_SEED`` to run other seeds). A failure names the seed, the step and the
calls so far.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from penguiflow.planner import PlannerEvent, Trajectory
from penguiflow.state import InMemoryStateStore as ReferenceStore
from penguiflow.state.models import (
    RemoteBinding,
    StateUpdate,
    SteeringEvent,
    SteeringEventType,
    StoredEvent,
    TaskContextSnapshot,
    TaskState,
    TaskStatus,
    TaskType,
    UpdateType,
)
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from guarded import guard
from guarded.backends.hybrid_store import HybridStateStore
from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from tests.hybrid.conftest import HotFactory
from tests.postgres.conftest import StoreFactory, new_schema_name
from tests.redis.conftest import RedisStoreFactory, new_prefix

SEQUENCES = 24
REDIS_SEQUENCES = 8
CALLS_PER_SEQUENCE = 150
HYBRID_SEQUENCES = 6
"""Sequences also made against ``guard(HybridStateStore)``: each of its calls goes to a store the
other sequences cover; what it adds is the routing, the per-part guards and the write-through."""
BASE_SEED = int(os.environ.get("GUARDED_DIFFERENTIAL_SEED", "20240614"))

SESSIONS = ("s1", "s2")
TASKS = ("k1", "k2", "k3")
TRACES = ("t1", "t2", "t3")
TOKENS = ("p1", "p2", "p3")
MEMORY_KEYS = ("m1", "m2")
ROUTERS = ("r1", "r2")
AGENTS = ("http://a", "http://b")
SKILLS = ("x", "y")
TENANTS = (None, "acme")
USERS = (None, "u1")
LIMITS: tuple[int | None, ...] = (None, None, 0, -1, -2, 1, 2, 3, 500)
"""``None``: the method's default."""
EPOCH = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
GLOBAL = "__global__"

Observation = tuple[str, Any]
"""``("returned", normalised value)`` or ``("raised", exception class name)``."""


# --- normalisation -----------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` with only representation removed (the module docstring's normalisations 1 and 2)."""
    if isinstance(value, Trajectory):
        return {"__type__": "Trajectory", **plain(value.serialise())}
    if isinstance(value, TaskState) and not value.progress:
        value = dataclasses.replace(value, progress=None)  # normalisation 3
    if isinstance(value, BaseModel):
        return {"__type__": type(value).__qualname__, **plain(value.model_dump())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {item.name: plain(getattr(value, item.name)) for item in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, **fields}
    if isinstance(value, enum.Enum):
        return (type(value).__qualname__, value.value)
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


async def observe(store: Any, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Observation:
    """Call ``store.method`` and return what a caller can observe of it."""
    try:
        result = await getattr(store, method)(*args, **kwargs)
    except Exception as exc:
        return ("raised", type(exc).__qualname__)
    return ("returned", plain(result))


# --- the oracle with the documented exceptions ---------------------------------------------------


def strict_json(value: Any) -> Any:
    """E3: non-finite floats as their string form, lone surrogates as U+FFFD, the rest unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {strict_json(key): strict_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [strict_json(item) for item in value]
    return value


class ReferenceWithExceptions(ReferenceStore):
    """PenguiFlow's reference store with exactly the exceptions E1-E3 applied (nothing else)."""

    async def save_update(self, update: StateUpdate) -> None:
        """E1: a repeated ``update_id`` within the session is ignored."""
        if any(stored.update_id == update.update_id for stored in self._updates.get(update.session_id, [])):
            return
        await super().save_update(update)

    async def save_steering(self, event: SteeringEvent) -> None:
        """E1: a repeated ``event_id`` within the session is ignored; E3: strict JSON payloads."""
        if any(stored.event_id == event.event_id for stored in self._steering.get(event.session_id, [])):
            return
        await super().save_steering(event.model_copy(update={"payload": strict_json(event.payload)}))

    async def load_history(self, trace_id: str) -> Sequence[StoredEvent]:
        """E5: an event saved with ``trace_id=None`` reads back with ``"__global__"``."""
        events = await super().load_history(trace_id)
        return [dataclasses.replace(event, trace_id=event.trace_id or GLOBAL) for event in events]

    async def save_task(self, state: TaskState) -> None:
        """E2: the task leaves any other session it was listed under."""
        for session_id, tasks in self._tasks.items():
            if session_id != state.session_id:
                tasks.pop(state.task_id, None)
        await super().save_task(state)


GUARDED = ("postgres", "hybrid", "redis")
"""The stores behind ``guard()``."""


def guard_exception(store: str, call: Call, expected: Observation) -> Observation:
    """E4: under ``guard()`` a pause whose payload is ``{}`` loads as ``None``."""
    if store in GUARDED and call.method == "load_planner_state" and expected == ("returned", {}):
        return ("returned", None)
    return expected


# --- random calls -------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        arguments = [repr(arg)[:120] for arg in self.args]
        arguments += [f"{name}={value!r}"[:120] for name, value in self.kwargs.items()]
        return f"{self.method}({', '.join(arguments)})"


class Odd:
    """An arbitrary object in a steering payload: both sanitizers keep its ``str()``."""

    def __str__(self) -> str:
        return "<odd object>"


@dataclass
class CallMaker:
    """Random PenguiFlow-typed calls, reusing earlier ids and objects to provoke collisions."""

    rnd: random.Random
    events: list[StoredEvent] = field(default_factory=list)
    update_ids: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    counter: int = 0

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.rnd.randrange(len(options))]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def when(self) -> dt.datetime:
        return EPOCH + dt.timedelta(
            seconds=self.rnd.randrange(10_000), microseconds=self.rnd.randrange(10**6)
        )

    def later(self) -> dt.datetime:
        """A time after every earlier one, as PenguiFlow's sessions stamp ``updated_at`` (see E6)."""
        self.counter += 1
        return EPOCH + dt.timedelta(seconds=self.counter)

    def scalar(self) -> Any:
        return self.pick(
            [
                None,
                True,
                False,
                self.rnd.randrange(-5, 1000),
                round(self.rnd.uniform(-10, 10), 3),
                "text",
                "",
                "ünïcødé ✓",
                "x" * self.rnd.randrange(1, 40),
            ]
        )

    def json_value(self, depth: int = 3) -> Any:
        roll = self.rnd.random()
        if depth <= 0 or roll < 0.6:
            return self.scalar()
        if roll < 0.8:
            return [self.json_value(depth - 1) for _ in range(self.rnd.randrange(4))]
        return self.json_object(depth - 1)

    def json_object(self, depth: int = 3) -> dict[str, Any]:
        return {f"f{index}": self.json_value(depth) for index in range(self.rnd.randrange(4))}

    def limit_kwargs(self) -> dict[str, Any]:
        limit = self.pick(LIMITS)
        return {} if limit is None else {"limit": limit}

    # --- the calls -----------------------------------------------------------------------------

    def make(self) -> Call:
        makers: list[tuple[int, Callable[[], Call]]] = [
            (6, self.save_event),
            (3, self.load_history),
            (5, self.save_remote_binding),
            (4, self.find_binding),
            (2, self.list_bindings),
            (2, self.mark_binding_terminal),
            (3, self.save_planner_state),
            (4, self.load_planner_state),
            (3, self.save_memory_state),
            (2, self.load_memory_state),
            (4, self.save_task),
            (2, self.list_tasks),
            (7, self.save_update),
            (6, self.list_updates),
            (7, self.save_steering),
            (6, self.list_steering),
            (3, self.save_trajectory),
            (2, self.get_trajectory),
            (3, self.list_traces),
            (3, self.save_planner_event),
            (2, self.list_planner_events),
        ]
        total = sum(weight for weight, _ in makers)
        roll = self.rnd.randrange(total)
        for weight, maker in makers:
            if roll < weight:
                return maker()
            roll -= weight
        raise AssertionError("unreachable")

    def save_event(self) -> Call:
        if self.events and self.rnd.random() < 0.2:
            return Call("save_event", (self.pick(self.events),))  # a retry of the same event
        event = StoredEvent(
            trace_id=self.pick((*TRACES, None)),
            ts=self.pick((1.0, 2.0, 2.0, 3.5, round(self.rnd.uniform(0, 5), 6))),
            kind=self.pick(("node_start", "node_success", "node_error")),
            node_name=self.pick(("parse", None)),
            node_id=self.pick(("n1", None)),
            payload=self.json_object(),
        )
        self.events.append(event)
        return Call("save_event", (event,))

    def load_history(self) -> Call:
        return Call("load_history", (self.pick((*TRACES, "__global__", "missing")),))

    def save_remote_binding(self) -> Call:
        binding = RemoteBinding(
            trace_id=self.pick(TRACES),
            context_id=self.pick((None, "c1")),
            task_id=self.pick(TASKS),
            agent_url=self.pick(AGENTS),
            router_session_id=self.pick((None, *ROUTERS)),
            remote_skill=self.pick((None, *SKILLS)),
            tenant_id=self.pick(TENANTS),
            user_id=self.pick(USERS),
            last_remote_task_id=self.pick((None, "rt1")),
            is_terminal=self.rnd.random() < 0.2,
            metadata=self.json_object(1),
        )
        return Call("save_remote_binding", (binding,))

    def find_binding(self) -> Call:
        kwargs: dict[str, Any] = {
            "router_session_id": self.pick(ROUTERS),
            "agent_url": self.pick(AGENTS),
            "remote_skill": self.pick(SKILLS),
        }
        if self.rnd.random() < 0.6:
            kwargs["tenant_id"] = self.pick(TENANTS)
        if self.rnd.random() < 0.6:
            kwargs["user_id"] = self.pick(USERS)
        return Call("find_binding", kwargs=kwargs)

    def list_bindings(self) -> Call:
        return Call("list_bindings", kwargs={"router_session_id": self.pick((*ROUTERS, "missing"))})

    def mark_binding_terminal(self) -> Call:
        key = {
            "trace_id": self.pick(TRACES),
            "context_id": self.pick((None, "c1")),
            "task_id": self.pick((*TASKS, "missing")),
        }
        return Call("mark_binding_terminal", kwargs=key)

    def save_planner_state(self) -> Call:
        return Call("save_planner_state", (self.pick(TOKENS), self.json_object()))

    def load_planner_state(self) -> Call:
        return Call("load_planner_state", (self.pick((*TOKENS, "missing")),))

    def save_memory_state(self) -> Call:
        return Call("save_memory_state", (self.pick(MEMORY_KEYS), self.json_object()))

    def load_memory_state(self) -> Call:
        return Call("load_memory_state", (self.pick((*MEMORY_KEYS, "missing")),))

    def save_task(self) -> Call:
        session_id, task_id = self.pick(SESSIONS), self.pick(TASKS)
        snapshot = TaskContextSnapshot(
            session_id=session_id,
            task_id=task_id,
            trace_id=self.pick((None, *TRACES)),
            spawned_at=self.when(),
            query=self.pick((None, "find it")),
            llm_context=self.json_object(1),
            memory=self.json_object(1),
        )
        state = TaskState(
            task_id=task_id,
            session_id=session_id,
            status=self.pick(list(TaskStatus)),
            task_type=self.pick(list(TaskType)),
            priority=self.rnd.randrange(-2, 10),
            context_snapshot=snapshot,
            trace_id=self.pick((None, *TRACES)),
            result=self.json_value(),
            error=self.pick((None, "boom")),
            description=self.pick((None, "a task")),
            progress=self.pick((None, self.json_object(1))),
            created_at=self.when(),
            updated_at=self.later(),
        )
        return Call("save_task", (state,))

    def list_tasks(self) -> Call:
        return Call("list_tasks", (self.pick((*SESSIONS, "missing")),))

    def save_update(self) -> Call:
        if self.update_ids and self.rnd.random() < 0.1:
            update_id = self.pick(self.update_ids)  # E1: a retried update
        else:
            update_id = self.fresh("u")
            self.update_ids.append(update_id)
        update = StateUpdate(
            session_id=self.pick(SESSIONS),
            task_id=self.pick(TASKS),
            trace_id=self.pick((None, *TRACES)),
            update_id=update_id,
            update_type=self.pick(list(UpdateType)),
            content=self.json_value(),
            step_index=self.pick((None, 0, 3)),
            total_steps=self.pick((None, 5)),
            created_at=self.when(),
        )
        return Call(self.pick(("save_update", "save_task_update")), (update,))

    def cursor_kwargs(self, ids: Sequence[str]) -> dict[str, Any]:
        kwargs: dict[str, Any] = self.limit_kwargs()
        if self.rnd.random() < 0.5:
            kwargs["task_id"] = self.pick((*TASKS, "missing"))
        if self.rnd.random() < 0.6:
            kwargs["since_id"] = self.pick((None, "", "unknown", *ids[-6:], *ids[-6:]))
        return kwargs

    def list_updates(self) -> Call:
        method = self.pick(("list_updates", "list_task_updates"))
        return Call(method, (self.pick((*SESSIONS, "missing")),), self.cursor_kwargs(self.update_ids))

    def steering_payload(self, event_type: SteeringEventType) -> dict[str, Any]:
        valid: dict[SteeringEventType, dict[str, Any]] = {
            SteeringEventType.INJECT_CONTEXT: {"text": "also check B", "scope": "foreground"},
            SteeringEventType.REDIRECT: {"instruction": "do C instead", "constraints": {"max": 2}},
            SteeringEventType.CANCEL: {"reason": "stop", "hard": True},
            SteeringEventType.PRIORITIZE: {"priority": 3},
            SteeringEventType.PAUSE: {"reason": "wait"},
            SteeringEventType.RESUME: {},
            SteeringEventType.APPROVE: {"resume_token": "tok", "decision": "yes"},
            SteeringEventType.REJECT: {"patch_id": "patch"},
            SteeringEventType.USER_MESSAGE: {"text": "hello", "active_tasks": ["k1"]},
        }
        odd: list[Callable[[], dict[str, Any]]] = [
            lambda: valid[event_type],
            lambda: valid[event_type],
            lambda: {"priority": True},
            lambda: {"items": [1, 2]},
            lambda: {},
            lambda: {"text": ""},
            lambda: {"text": "y" * 5000},
            lambda: {"list": list(range(60))},
            lambda: {f"k{index}": index for index in range(70)},
            lambda: {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}},
            lambda: {"tuple": (1, "two"), "set": {3}, "frozen": frozenset({4})},
            lambda: {"nested": {1: "int key", None: "none key", ("t",): "tuple key"}},
            lambda: {"when": EPOCH, "amount": decimal.Decimal("1.50"), "odd": Odd(), "raw": b"x"},
            lambda: {f"s{index}": "z" * 1000 for index in range(20)},
            lambda: {f"s{index}": "é✓" * 1000 for index in range(4)},
            lambda: {f"s{index}": "😀" * 2000 for index in range(3)},
            lambda: {"long key " + "k" * 100: 1},
            lambda: {"nan": math.nan, "inf": -math.inf},
            lambda: {"surrogate": "a\ud800b"},
            lambda: self.json_object(),
        ]
        return self.pick(odd)()

    def save_steering(self) -> Call:
        if self.event_ids and self.rnd.random() < 0.1:
            event_id = self.pick(self.event_ids)  # E1: a retried steering event
        else:
            event_id = self.fresh("e")
            self.event_ids.append(event_id)
        event_type = self.pick(list(SteeringEventType))
        event = SteeringEvent(
            session_id=self.pick(SESSIONS),
            task_id=self.pick(TASKS),
            event_id=event_id,
            event_type=event_type,
            payload=self.steering_payload(event_type),
            trace_id=self.pick((None, *TRACES)),
            source=self.pick(("user", "system")),
            created_at=self.when(),
        )
        return Call("save_steering", (event,))

    def list_steering(self) -> Call:
        return Call("list_steering", (self.pick((*SESSIONS, "missing")),), self.cursor_kwargs(self.event_ids))

    def save_trajectory(self) -> Call:
        trajectory = Trajectory(query=self.pick(("q1", "q2")), metadata=self.json_object(1))
        return Call("save_trajectory", (self.pick(TRACES), self.pick(SESSIONS), trajectory))

    def get_trajectory(self) -> Call:
        return Call("get_trajectory", (self.pick((*TRACES, "missing")), self.pick(SESSIONS)))

    def list_traces(self) -> Call:
        limit = self.pick((None, 0, -1, -2, 1, 2, 50))
        args = (self.pick((*SESSIONS, "missing")),) if limit is None else (self.pick(SESSIONS), limit)
        return Call("list_traces", args)

    def save_planner_event(self) -> Call:
        event = PlannerEvent(
            event_type=self.pick(("step_start", "tool_call", "stream_chunk")),
            ts=round(self.rnd.uniform(0, 100), 6),
            trajectory_step=self.rnd.randrange(5),
            thought=self.pick((None, "think")),
            node_name=self.pick((None, "search")),
            latency_ms=self.pick((None, 1.5)),
            token_estimate=self.pick((None, 12)),
            error=self.pick((None, "bad")),
            extra=self.json_object(1),
        )
        return Call("save_planner_event", (self.pick(TRACES), event))

    def list_planner_events(self) -> Call:
        method = self.pick(("list_planner_events", "get_events"))
        return Call(method, (self.pick((*TRACES, "missing")),))


# --- running sequences --------------------------------------------------------------------------


@dataclass
class Difference:
    seed: int
    step: int
    store: str
    call: str
    expected: Observation
    got: Observation

    @property
    def kind(self) -> str:
        return f"{self.store}:{self.call.split('(')[0]}"


async def run_sequence(
    seed: int, stores: Mapping[str, Any], oracle: Any, *, calls: int = CALLS_PER_SEQUENCE
) -> list[Difference]:
    """Make ``calls`` random calls against the oracle and ``stores``; every difference, in order."""
    maker = CallMaker(random.Random(seed))
    differences: list[Difference] = []
    for step in range(calls):
        call = maker.make()
        expected = await observe(oracle, call.method, call.args, call.kwargs)
        for name, store in stores.items():
            got = await observe(store, call.method, call.args, call.kwargs)
            if got != guard_exception(name, call, expected):
                differences.append(Difference(seed, step, name, str(call), expected, got))
    return differences


async def three_stores(make_store: StoreFactory, index: int) -> dict[str, Any]:
    """Our in-memory store and ``guard(PostgresStateStore)`` on a fresh schema, PenguiFlow's types."""
    types = penguiflow_types()
    backend = await make_store(schema=new_schema_name(), types=types)
    guarded = guard(backend, name=f"differential-{index}", registry=CollectorRegistry())
    return {"memory": InMemoryStateStore(record_types=types), "postgres": guarded}


def describe(differences: Sequence[Difference]) -> str:
    """How many differences of each kind (store and method), and the first of each kind."""
    first: dict[str, Difference] = {}
    counts: dict[str, int] = {}
    for difference in differences:
        first.setdefault(difference.kind, difference)
        counts[difference.kind] = counts.get(difference.kind, 0) + 1
    lines = [f"{len(differences)} differences from PenguiFlow's reference store"]
    for kind, example in first.items():
        lines.append(
            f"{kind}: {counts[kind]}; first at seed {example.seed} step {example.step}: {example.call}\n"
            f"    oracle: {example.expected!r}\n    got:    {example.got!r}"
        )
    return "\n".join(lines)


async def guarded_hybrid(make_hot: HotFactory, make_store: StoreFactory, index: int) -> Any:
    """``guard(HybridStateStore)``, memory written through, on a fresh schema, PenguiFlow's types."""
    types = penguiflow_types()
    hybrid = HybridStateStore(
        hot=await make_hot(types=types),
        record=await make_store(schema=new_schema_name(), types=types),
        memory_write_through=True,
    )
    return guard(hybrid, name=f"differential-hybrid-{index}", registry=CollectorRegistry())


@pytest.mark.asyncio
async def test_random_calls_agree_with_penguiflows_reference(
    make_store: StoreFactory, make_hot: HotFactory
) -> None:
    differences: list[Difference] = []
    for index in range(SEQUENCES):
        stores = await three_stores(make_store, index)
        if index < HYBRID_SEQUENCES:
            stores["hybrid"] = await guarded_hybrid(make_hot, make_store, index)
        async with AsyncExitStack() as stack:
            for name in GUARDED:
                if name in stores:
                    await stack.enter_async_context(stores[name])
            differences += await run_sequence(BASE_SEED + index, stores, ReferenceWithExceptions())
    assert not differences, describe(differences)


@pytest.mark.asyncio
async def test_random_calls_agree_with_penguiflows_reference_on_redis(
    make_redis_store: RedisStoreFactory,
) -> None:
    differences: list[Difference] = []
    for index in range(REDIS_SEQUENCES):
        backend = await make_redis_store(prefix=new_prefix(), types=penguiflow_types())
        guarded = guard(backend, name=f"differential-redis-{index}", registry=CollectorRegistry())
        async with guarded:
            differences += await run_sequence(
                BASE_SEED + index, {"redis": guarded}, ReferenceWithExceptions()
            )
    assert not differences, describe(differences)


# --- the exceptions, each asserted against the plain oracle ---------------------------------------


async def last_results(make_store: StoreFactory, calls: Sequence[Call]) -> dict[str, Observation]:
    """Run ``calls`` on the plain oracle and our two stores; the last call's observation of each."""
    stores = await three_stores(make_store, 0)
    stores["penguiflow"] = ReferenceStore()
    results: dict[str, Observation] = {}
    async with stores["postgres"]:
        for name, store in stores.items():
            for call in calls:
                results[name] = await observe(store, call.method, call.args, call.kwargs)
    return results


def update(update_id: str, content: str) -> StateUpdate:
    return StateUpdate(
        session_id="s1", task_id="k1", update_id=update_id, update_type=UpdateType.PROGRESS, content=content
    )


def steering(event_id: str, payload: dict[str, Any]) -> SteeringEvent:
    return SteeringEvent(
        session_id="s1",
        task_id="k1",
        event_id=event_id,
        event_type=SteeringEventType.USER_MESSAGE,
        payload=payload,
    )


def task(session_id: str, updated_at: dt.datetime, status: TaskStatus = TaskStatus.RUNNING) -> TaskState:
    snapshot = TaskContextSnapshot(session_id=session_id, task_id="k1")
    return TaskState(
        task_id="k1",
        session_id=session_id,
        status=status,
        task_type=TaskType.BACKGROUND,
        priority=0,
        context_snapshot=snapshot,
        created_at=EPOCH,
        updated_at=updated_at,
    )


def contents(observation: Observation, field_name: str) -> list[Any]:
    return [item[field_name] for item in observation[1]]


@pytest.mark.asyncio
async def test_exception_e1_updates_and_steering_are_idempotent_by_id(make_store: StoreFactory) -> None:
    for save, list_method, items, key in [
        ("save_update", "list_updates", [update("u1", "a"), update("u1", "a")], "update_id"),
        ("save_steering", "list_steering", [steering("e1", {"text": "a"})] * 2, "event_id"),
    ]:
        calls = [*(Call(save, (item,)) for item in items), Call(list_method, ("s1",))]
        results = await last_results(make_store, calls)
        assert contents(results["penguiflow"], key) == [items[0].model_dump()[key]] * 2
        assert (
            contents(results["memory"], key)
            == contents(results["postgres"], key)
            == [items[0].model_dump()[key]]
        )


@pytest.mark.asyncio
async def test_exception_e2_a_task_saved_under_another_session_moves(make_store: StoreFactory) -> None:
    calls = [
        Call("save_task", (task("s1", EPOCH),)),
        Call("save_task", (task("s2", EPOCH + dt.timedelta(seconds=1)),)),
        Call("list_tasks", ("s1",)),
    ]
    results = await last_results(make_store, calls)
    assert contents(results["penguiflow"], "session_id") == ["s1"]  # a stale copy
    assert results["memory"] == results["postgres"] == ("returned", [])


@pytest.mark.asyncio
async def test_exception_e3_steering_payloads_are_strict_json(make_store: StoreFactory) -> None:
    results = await last_results(make_store, [Call("save_steering", (steering("e1", {"text": "a\ud800"}),))])
    assert results["penguiflow"] == ("raised", "UnicodeEncodeError")  # the event is lost
    calls = [
        Call("save_steering", (steering("e1", {"text": "a\ud800", "score": math.nan}),)),
        Call("list_steering", ("s1",)),
    ]
    results = await last_results(make_store, calls)
    assert results["penguiflow"] == ("returned", [])
    expected = {"text": "a\ufffd", "score": "nan"}
    assert contents(results["memory"], "payload") == contents(results["postgres"], "payload") == [expected]
    nan_only = [Call("save_steering", (steering("e2", {"score": math.inf}),)), Call("list_steering", ("s1",))]
    results = await last_results(make_store, nan_only)
    assert contents(results["penguiflow"], "payload") == [{"score": math.inf}]
    assert (
        contents(results["memory"], "payload")
        == contents(results["postgres"], "payload")
        == [{"score": "inf"}]
    )


@pytest.mark.asyncio
async def test_exception_e4_an_empty_pause_loads_as_none_under_the_guard(make_store: StoreFactory) -> None:
    results = await last_results(
        make_store, [Call("save_planner_state", ("p1", {})), Call("load_planner_state", ("p1",))]
    )
    assert results["penguiflow"] == results["memory"] == ("returned", {})
    assert results["postgres"] == ("returned", None)


@pytest.mark.asyncio
async def test_exception_e5_a_global_event_reads_back_with_the_sentinel(make_store: StoreFactory) -> None:
    event = StoredEvent(trace_id=None, ts=1.0, kind="node_start", node_name=None, node_id=None, payload={})
    results = await last_results(make_store, [Call("save_event", (event,)), Call("load_history", (GLOBAL,))])
    assert contents(results["penguiflow"], "trace_id") == [None]
    assert contents(results["memory"], "trace_id") == contents(results["postgres"], "trace_id") == [GLOBAL]


@pytest.mark.asyncio
async def test_exception_e6_postgres_tasks_are_last_write_wins_by_updated_at(
    make_store: StoreFactory,
) -> None:
    later, earlier = EPOCH + dt.timedelta(seconds=10), EPOCH
    calls = [
        Call("save_task", (task("s1", later, TaskStatus.COMPLETE),)),
        Call("save_task", (task("s1", earlier, TaskStatus.RUNNING),)),  # a late replay
        Call("list_tasks", ("s1",)),
    ]
    results = await last_results(make_store, calls)
    assert contents(results["penguiflow"], "status") == contents(results["memory"], "status")
    assert contents(results["memory"], "status") == [("TaskStatus", "RUNNING")]
    assert contents(results["postgres"], "status") == [("TaskStatus", "COMPLETE")]
