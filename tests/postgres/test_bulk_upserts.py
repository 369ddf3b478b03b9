"""Bulk upserts: each leaves exactly what the single method called once per item in list order
leaves, validates every item before writing anything, and is one statement."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from guarded.backends.postgres import PoolSettings, PostgresStateStore
from guarded.backends.postgres.schema_names import quote_ident
from guarded.errors import InvalidPayloadError
from guarded.models import RemoteBinding, TaskContextSnapshot, TaskState, TaskStatus, TaskType
from guarded.pipeline.idempotency import idempotency_key

from .conftest import StoreFactory, new_schema_name

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SEEDS = [1, 2, 3, 4]

Snapshot = Callable[[PostgresStateStore], Awaitable[Any]]


# --- records ---------------------------------------------------------------------------------------


def task(
    task_id: str,
    session: str = "s",
    *,
    seconds: int = 0,
    status: TaskStatus = TaskStatus.RUNNING,
    naive: bool = False,
    priority: int = 1,
    **changes: Any,
) -> TaskState:
    updated_at = T0 + timedelta(seconds=seconds)
    return TaskState(
        task_id=task_id,
        session_id=session,
        status=status,
        task_type=TaskType.BACKGROUND,
        priority=priority,
        context_snapshot=TaskContextSnapshot(session_id=session, task_id=task_id),
        updated_at=updated_at.replace(tzinfo=None) if naive else updated_at,
        **changes,
    )


def binding(
    trace_id: str,
    context_id: str | None = None,
    task_id: str = "x",
    *,
    router: str = "r",
    tenant: str | None = None,
    terminal: bool = False,
    **metadata: Any,
) -> RemoteBinding:
    return RemoteBinding(
        trace_id=trace_id,
        context_id=context_id,
        task_id=task_id,
        agent_url="https://agent",
        router_session_id=router,
        remote_skill="skill",
        tenant_id=tenant,
        is_terminal=terminal,
        metadata=metadata,
    )


def random_tasks(rng: random.Random, count: int, *, unique: bool) -> list[TaskState]:
    ids = rng.sample([f"t{index}" for index in range(count * 2)], count) if unique else None
    return [
        task(
            ids[index] if ids else f"t{rng.randrange(8)}",
            rng.choice(["s0", "s1", "s2"]),
            seconds=rng.randrange(20),
            status=rng.choice(list(TaskStatus)),
            naive=rng.random() < 0.2,
            priority=index,
        )
        for index in range(count)
    ]


def random_bindings(rng: random.Random, count: int) -> list[RemoteBinding]:
    return [
        binding(
            f"tr{rng.randrange(5)}",
            rng.choice([None, "c1"]),
            rng.choice(["x", "y\x00"]),
            router=rng.choice(["r0", "r1"]),
            tenant=rng.choice([None, "ten"]),
            terminal=rng.random() < 0.15,
            i=index,
        )
        for index in range(count)
    ]


def binding_keys(rng: random.Random, count: int) -> list[tuple[str, str | None, str]]:
    return [
        (f"tr{rng.randrange(7)}", rng.choice([None, "c1"]), rng.choice(["x", "y\x00"])) for _ in range(count)
    ]


# --- read-backs ------------------------------------------------------------------------------------


async def table(store: PostgresStateStore, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` with ``{t}`` the store's schema, as plain tuples."""
    records = await store.pool.fetch(sql.format(t=quote_ident(store.schema)))
    return [tuple(record) for record in records]


async def memory_snapshot(store: PostgresStateStore) -> Any:
    rows = await table(store, "SELECT key, state::text FROM {t}.memory_states ORDER BY key")
    keys = [f"k{index}" for index in range(12)] + ["k\x00"]
    return rows, [await store.load_memory_state(key) for key in keys]


async def task_snapshot(store: PostgresStateStore) -> Any:
    rows = await table(
        store,
        "SELECT task_id, session_id, status, task_type, trace_id, updated_at, doc::text, "
        "rank() OVER (ORDER BY list_seq) FROM {t}.task_states ORDER BY task_id",
    )
    return rows, [await store.list_tasks(session) for session in ("s", "s0", "s1", "s2")]


async def trajectory_snapshot(store: PostgresStateStore) -> Any:
    rows = await table(
        store,
        "SELECT trace_id, session_id, doc::text, rank() OVER (ORDER BY saved_seq) "
        "FROM {t}.trajectories ORDER BY trace_id",
    )
    listed = [await store.list_traces(session) for session in ("s0", "s1", "s2")]
    loaded = [
        await store.get_trajectory(f"tr{index}", session) for index in range(8) for session in ("s0", "s1")
    ]
    return rows, listed, loaded


async def binding_snapshot(store: PostgresStateStore) -> Any:
    rows = await table(
        store,
        "SELECT trace_id, context_key, task_id, agent_url, router_session_id, remote_skill, tenant_id, "
        "user_id, is_terminal, doc::text, rank() OVER (ORDER BY id), rank() OVER (ORDER BY saved_seq) "
        "FROM {t}.remote_bindings ORDER BY trace_id, context_key, task_id",
    )
    listed = [await store.list_bindings(router_session_id=router) for router in ("r", "r0", "r1")]
    found = [
        await store.find_binding(
            router_session_id=router, agent_url="https://agent", remote_skill="skill", tenant_id=tenant
        )
        for router in ("r", "r0", "r1")
        for tenant in (None, "ten")
    ]
    return rows, listed, found


async def pause_snapshot(store: PostgresStateStore) -> Any:
    """The stored pauses, then what loading every token gives (this consumes them)."""
    rows = await table(
        store,
        # The TTL counts from each save's call: to the second, as the two stores' calls differ.
        "SELECT token, payload::text, round(extract(epoch FROM expires_at - created_at)), "
        "consumed_at IS NULL, consumer_key "
        "FROM {t}.planner_pauses ORDER BY token",
    )
    loads = []
    for index in range(8):
        with idempotency_key(f"load-{index}"):
            loads.append(await store.load_planner_state(f"p{index}"))
    return rows, loads


@dataclass(frozen=True)
class Form:
    """A bulk form, the single method it stands for and how to read its table back."""

    bulk: str
    single: str
    snapshot: Snapshot
    table: str

    async def call_single(self, store: PostgresStateStore, item: Any) -> None:
        method = getattr(store, self.single)
        if self.single == "mark_binding_terminal":
            trace_id, context_id, task_id = item
            await method(trace_id=trace_id, context_id=context_id, task_id=task_id)
        elif isinstance(item, tuple):
            await method(*item)
        else:
            await method(item)

    async def call_bulk(self, store: PostgresStateStore, items: Sequence[Any]) -> None:
        await getattr(store, self.bulk)(items)


MEMORY = Form("save_memory_states", "save_memory_state", memory_snapshot, "memory_states")
TASKS = Form("save_tasks", "save_task", task_snapshot, "task_states")
TRAJECTORIES = Form("save_trajectories", "save_trajectory", trajectory_snapshot, "trajectories")
BINDINGS = Form("save_remote_bindings", "save_remote_binding", binding_snapshot, "remote_bindings")
MARKS = Form("mark_bindings_terminal", "mark_binding_terminal", binding_snapshot, "remote_bindings")
PAUSES = Form("save_planner_states", "save_planner_state", pause_snapshot, "planner_pauses")


@pytest_asyncio.fixture
async def pair(make_store: StoreFactory) -> tuple[PostgresStateStore, PostgresStateStore]:
    """Two stores on two fresh schemas: one written in bulk, one with single calls."""
    return await make_store(schema=new_schema_name()), await make_store(schema=new_schema_name())


async def assert_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore],
    form: Form,
    batch: Sequence[Any],
    *,
    before: Sequence[tuple[Form, Any]] = (),
) -> None:
    """Apply ``before`` with single calls to both stores, then ``batch`` in bulk to one and item by
    item to the other; both must read back the same."""
    bulk, singles = pair
    for store in pair:
        for earlier_form, item in before:
            await earlier_form.call_single(store, item)
    await form.call_bulk(bulk, batch)
    for item in batch:
        await form.call_single(singles, item)
    assert await form.snapshot(bulk) == await form.snapshot(singles)


# --- bulk == singles -------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
async def test_memory_states_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int
) -> None:
    rng = random.Random(seed)
    keys = [f"k{index}" for index in range(10)] + ["k\x00"]

    def item(index: int) -> tuple[str, dict[str, Any]]:
        return rng.choice(keys), {"i": index, "text": rng.choice(["a", "é\x00", "\U0001f600"]), "f": 1e16}

    before = [(MEMORY, item(-index)) for index in range(1, 8)]
    await assert_bulk_equals_singles(pair, MEMORY, [item(index) for index in range(60)], before=before)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("unique", [True, False], ids=["distinct-ids", "repeated-ids"])
async def test_tasks_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int, unique: bool
) -> None:
    rng = random.Random(seed)
    before = [(TASKS, item) for item in random_tasks(rng, 10, unique=False)]
    batch = random_tasks(rng, 12 if unique else 60, unique=unique)
    await assert_bulk_equals_singles(pair, TASKS, batch, before=before)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
async def test_trajectories_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int
) -> None:
    rng = random.Random(seed)

    def item(index: int) -> tuple[str, str, dict[str, Any]]:
        return f"tr{rng.randrange(8)}", rng.choice(["s0", "s1", "s2"]), {"step": index, "x": [1.5, None]}

    before = [(TRAJECTORIES, item(-index)) for index in range(1, 6)]
    await assert_bulk_equals_singles(pair, TRAJECTORIES, [item(index) for index in range(50)], before=before)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
async def test_remote_bindings_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int
) -> None:
    rng = random.Random(seed)
    before = [(BINDINGS, item) for item in random_bindings(rng, 6)] + [
        (MARKS, key) for key in binding_keys(rng, 3)
    ]
    await assert_bulk_equals_singles(pair, BINDINGS, random_bindings(rng, 50), before=before)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
async def test_mark_bindings_terminal_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int
) -> None:
    rng = random.Random(seed)
    before = [(BINDINGS, item) for item in random_bindings(rng, 25)]
    await assert_bulk_equals_singles(pair, MARKS, binding_keys(rng, 20), before=before)


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", SEEDS)
async def test_planner_states_bulk_equals_singles(
    pair: tuple[PostgresStateStore, PostgresStateStore], seed: int
) -> None:
    rng = random.Random(seed)

    def item(index: int) -> tuple[str, dict[str, Any]]:
        return f"p{rng.randrange(8)}", {"i": index, "text": "\x00é"}

    for store in pair:  # some tokens saved, some of them consumed (with and without a key)
        for index in range(6):
            await store.save_planner_state(f"p{index}", {"before": index})
        with idempotency_key("consumer"):
            assert await store.load_planner_state("p0") == {"before": 0}
        assert await store.load_planner_state("p1") == {"before": 1}
    await assert_bulk_equals_singles(pair, PAUSES, [item(index) for index in range(30)])


# --- duplicates inside one list --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_last_item_of_a_key_wins(store: PostgresStateStore) -> None:
    await store.save_memory_states([("k", {"v": 1}), ("j", {"v": 2}), ("k", {"v": 3})])
    assert await store.load_memory_state("k") == {"v": 3}
    assert await store.load_memory_state("j") == {"v": 2}

    await store.save_trajectories([("a", "s", {"v": 1}), ("b", "s", {"v": 2}), ("a", "s", {"v": 3})])
    assert await store.get_trajectory("a", "s") == {"v": 3}
    assert await store.list_traces("s") == ["a", "b"]  # a was saved last

    await store.save_planner_states([("p", {"v": 1}), ("q", {"v": 2}), ("p", {"v": 3})])
    assert await store.load_planner_state("p") == {"v": 3}

    await store.save_remote_bindings([binding("a", v=1), binding("b", v=2), binding("a", v=3)])
    listed = await store.list_bindings(router_session_id="r")
    assert [(item.trace_id, item.metadata) for item in listed] == [("a", {"v": 3}), ("b", {"v": 2})]
    found = await store.find_binding(router_session_id="r", agent_url="https://agent", remote_skill="skill")
    assert found is not None
    assert found.trace_id == "a"  # saved last


@pytest.mark.asyncio
@pytest.mark.parametrize("unique", [True, False], ids=["one-item-per-task", "several-items-per-task"])
async def test_tasks_never_go_back_to_an_older_updated_at(store: PostgresStateStore, unique: bool) -> None:
    await store.save_task(task("stored", seconds=10, status=TaskStatus.COMPLETE))
    batch = [task("stored", seconds=5, status=TaskStatus.RUNNING)]  # older than the stored one
    if not unique:
        batch += [
            task("new", seconds=30, status=TaskStatus.COMPLETE),
            task("new", seconds=20, status=TaskStatus.RUNNING),  # older than the item before it
            task("tie", seconds=1, status=TaskStatus.PENDING),
            task("tie", seconds=1, status=TaskStatus.PAUSED),  # equal: the later one wins
        ]
    await store.save_tasks(batch)
    statuses = {item.task_id: item.status for item in await store.list_tasks("s")}
    expected = {"stored": TaskStatus.COMPLETE}
    if not unique:
        expected |= {"new": TaskStatus.COMPLETE, "tie": TaskStatus.PAUSED}
    assert statuses == expected


@pytest.mark.asyncio
async def test_a_resaved_pause_is_consumable_again(store: PostgresStateStore) -> None:
    await store.save_planner_state("p", {"v": 1})
    with idempotency_key("first"):
        assert await store.load_planner_state("p") == {"v": 1}
    await store.save_planner_states([("p", {"v": 2}), ("q", {"v": 3})])
    with idempotency_key("second"):
        assert await store.load_planner_state("p") == {"v": 2}
    assert await store.load_planner_state("p") is None


@pytest.mark.asyncio
async def test_bulk_pauses_expire_after_the_ttl(make_store: StoreFactory) -> None:
    store = await make_store(pause_ttl=0.2)
    await store.save_planner_states([("p", {"v": 1}), ("q", {"v": 2})])
    await asyncio.sleep(0.3)
    assert await store.load_planner_state("p") is None
    assert await store.load_planner_state("q") is None


# --- validation ------------------------------------------------------------------------------------

NAN = float("nan")

BAD_ITEMS: list[tuple[Form, Any, Any, str]] = [
    (MEMORY, ("k", {"v": 1}), ("j", {"v": NAN}), "items[1].state"),
    (MEMORY, ("k", {"v": 1}), ("j",), "items[1]"),
    (MEMORY, ("k", {"v": 1}), (7, {}), "items[1].key"),
    (TASKS, task("a"), task("b", result=NAN), "states[1]"),
    (TASKS, task("a"), "not a task", "states[1]"),
    (TRAJECTORIES, ("a", "s", {"v": 1}), ("b", "s", {"v": float("inf")}), "items[1].trajectory"),
    (TRAJECTORIES, ("a", "s", {"v": 1}), ("b\udc80", "s", {}), "items[1].trace_id"),
    (BINDINGS, binding("a"), binding("b", v=NAN), "bindings[1]"),
    (MARKS, ("a", None, "x"), ("a", None, 5), "items[1].task_id"),
    (MARKS, ("a", None, "x"), ["a", None], "items[1]"),
    (PAUSES, ("p", {"v": 1}), ("q", {"v": NAN}), "items[1].payload"),
    (PAUSES, ("p", {"v": 1}), ("\udc80", {}), "items[1].token"),
    (PAUSES, ("p", {"v": 1}), ("q", ["not", "an", "object"]), "items[1].payload"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("form", "good", "bad", "path"), BAD_ITEMS, ids=[f"{case[0].bulk}-{case[3]}" for case in BAD_ITEMS]
)
async def test_a_bad_item_raises_and_nothing_is_written(
    store: PostgresStateStore, form: Form, good: Any, bad: Any, path: str
) -> None:
    if form is MARKS:
        await store.save_remote_binding(binding("a"))
    before = await table(store, f"SELECT * FROM {{t}}.{form.table}")
    with pytest.raises(InvalidPayloadError) as raised:
        await form.call_bulk(store, [good, bad, good])
    assert raised.value.method == form.bulk
    assert raised.value.path.startswith(path), raised.value.path
    assert await table(store, f"SELECT * FROM {{t}}.{form.table}") == before
    if raised.value.path != "items[1]":  # not a shape error: the single method refuses it too
        with pytest.raises(InvalidPayloadError):
            await form.call_single(store, bad)


# --- one statement, nothing for an empty list ------------------------------------------------------

ALL_FORMS = [MEMORY, TASKS, TRAJECTORIES, BINDINGS, MARKS, PAUSES]


def thousand(form: Form) -> list[Any]:
    if form is MEMORY:
        return [(f"k{index}", {"i": index}) for index in range(1_000)]
    if form is TASKS:
        return [task(f"t{index}", seconds=index) for index in range(1_000)]
    if form is TRAJECTORIES:
        return [(f"tr{index}", "s", {"i": index}) for index in range(1_000)]
    if form in (BINDINGS, MARKS):
        return [binding(f"tr{index}", i=index) for index in range(1_000)]
    return [(f"p{index}", {"i": index}) for index in range(1_000)]


@pytest_asyncio.fixture
async def logged(make_store: StoreFactory) -> tuple[PostgresStateStore, list[str]]:
    """A store whose connections record every statement they send."""
    queries: list[str] = []

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: queries.append(record.query))

    store = await make_store(pool=PoolSettings(min_size=1, max_size=2, command_timeout=30.0, init=init))
    return store, queries


def statements_on(queries: list[str], store: PostgresStateStore, form: Form) -> list[str]:
    return [query for query in queries if f"{quote_ident(store.schema)}.{quote_ident(form.table)}" in query]


@pytest.mark.asyncio
@pytest.mark.parametrize("form", ALL_FORMS, ids=[form.bulk for form in ALL_FORMS])
async def test_a_thousand_items_are_one_statement(
    logged: tuple[PostgresStateStore, list[str]], form: Form
) -> None:
    store, queries = logged
    items = thousand(form)
    if form is MARKS:
        await store.save_remote_bindings(items)
        items = [(item.trace_id, item.context_id, item.task_id) for item in items]
    queries.clear()
    await form.call_bulk(store, items)
    assert len(statements_on(queries, store, form)) == 1
    if form is MARKS:
        assert await table(store, "SELECT count(*) FROM {t}.remote_bindings WHERE is_terminal") == [(1_000,)]
    else:
        assert await table(store, f"SELECT count(*) FROM {{t}}.{form.table}") == [(1_000,)]


@pytest.mark.asyncio
async def test_tasks_named_twice_are_still_one_round_trip(
    logged: tuple[PostgresStateStore, list[str]],
) -> None:
    store, queries = logged
    queries.clear()
    await store.save_tasks([task(f"t{index % 100}", seconds=index) for index in range(1_000)])
    assert len(statements_on(queries, store, TASKS)) == 1  # one pipelined executemany
    listed = await store.list_tasks("s")
    assert [item.priority for item in listed] == [1] * 100
    assert [item.updated_at for item in listed] == [
        T0 + timedelta(seconds=900 + index) for index in range(100)
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("form", ALL_FORMS, ids=[form.bulk for form in ALL_FORMS])
async def test_an_empty_list_is_a_no_op(logged: tuple[PostgresStateStore, list[str]], form: Form) -> None:
    store, queries = logged
    queries.clear()
    await form.call_bulk(store, [])
    assert statements_on(queries, store, form) == []


# --- concurrency -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_concurrent_bulk_writes_of_shared_keys_do_not_deadlock(store: PostgresStateStore) -> None:
    rng = random.Random(7)
    orders = [rng.sample(range(300), 300) for _ in range(4)]
    await asyncio.gather(
        *(
            store.save_memory_states([(f"k{index}", {"w": writer}) for index in order])
            for writer, order in enumerate(orders)
        ),
        *(
            store.save_tasks([task(f"t{index}", seconds=writer) for index in order])
            for writer, order in enumerate(orders)
        ),
        *(
            store.save_trajectories([(f"tr{index}", "s", {"w": writer}) for index in order])
            for writer, order in enumerate(orders)
        ),
    )
    assert await table(store, "SELECT count(*) FROM {t}.memory_states") == [(300,)]
    assert {item.updated_at for item in await store.list_tasks("s")} == {T0 + timedelta(seconds=3)}
    assert len(await store.list_traces("s", limit=1_000)) == 300
