"""The guard's lifecycle at the edges a user meets first: the default configuration, a guard never
closed, a close right after an outage while the breaker is still open, a memory-only buffer, and
legacy aliases sharing their target's pending writes."""

from __future__ import annotations

import asyncio
import gc
import logging
import types
import weakref
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import BatchConfig, BreakerConfig, DeadLetterConfig, GuardConfig, MethodConfig
from guarded.guard_core import core_of
from guarded.models import StateUpdate, UpdateType
from guarded.pipeline.call import Call
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector

from .support import event, fast_config, no_background_replay

OUTAGE = FaultPlan.always(Fault.error_before(ConnectionRefusedError))


def update(update_id: str, index: int) -> StateUpdate:
    return StateUpdate(
        session_id="s1",
        task_id="t1",
        update_id=update_id,
        update_type=UpdateType.PROGRESS,
        content={"i": index},
    )


@pytest.mark.asyncio
async def test_the_default_configuration_spills_to_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    store = guard(faulty, name="agents", registry=CollectorRegistry())
    async with store:
        await store.save_memory_state("k", {"v": 1})
        buffer = controller(store).dead_letters
        assert buffer is not None
        assert buffer.depth == 1
        assert buffer.spill_path is not None
        assert Path(buffer.spill_path).parent == tmp_path / "state" / "guarded"
        assert Path(buffer.spill_path).name.startswith("agents")
        fault_injector(faulty).plan = FaultPlan()


@pytest.mark.asyncio
async def test_the_spill_path_default_is_read_when_the_configuration_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GUARDED_DLQ_PATH", str(tmp_path / "set-late-{name}.sqlite"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "set-late-{name}.sqlite")
    monkeypatch.delenv("GUARDED_DLQ_PATH")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert GuardConfig().dead_letter.path == str(tmp_path / "xdg" / "guarded" / "{name}-{identity}.sqlite")


@pytest.mark.asyncio
async def test_a_group_committed_write_is_in_the_backend_when_the_call_returns() -> None:
    backend = InMemoryStateStore()
    store = guard(
        backend, registry=CollectorRegistry(), config=GuardConfig(batching=BatchConfig(max_delay=3600))
    )
    async with store:
        await store.save_event(event("t1", 0))
        assert await backend.load_history("t1") == [event("t1", 0)]  # no flush, no timer


@pytest.mark.asyncio
async def test_aliases_share_their_targets_pending_writes() -> None:
    """``save_update`` and ``save_task_update`` queue together (write-behind, never flushed by a
    timer here), and ``list_updates`` / ``list_task_updates`` both see both."""
    backend = InMemoryStateStore()
    config = GuardConfig(batching=BatchConfig(ack="enqueue", max_delay=3600))
    store = guard(backend, registry=CollectorRegistry(), config=config)
    async with store:
        await store.save_update(update("u1", 1))
        await store.save_task_update(update("u2", 2))
        assert await backend.list_updates("s1") == []  # both still queued
        assert [u.update_id for u in await store.list_updates("s1")] == ["u1", "u2"]
        await store.save_task_update(update("u3", 3))
        assert [u.update_id for u in await store.list_task_updates("s1")] == ["u1", "u2", "u3"]


class _GatedUpdates(InMemoryStateStore):
    """Writes of updates wait for ``gate`` (a flush held in flight, no clock involved)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def save_update(self, update: StateUpdate) -> None:
        self.started.set()
        await self.gate.wait()
        await super().save_update(update)


@pytest.mark.asyncio
async def test_a_write_behind_alias_queued_behind_a_group_commit_of_its_target_is_read_back() -> None:
    """``save_update`` group-commits (the default) and ``save_task_update`` is configured to
    acknowledge at enqueue; they share one queue. A ``save_task_update`` acknowledged while a
    ``save_update`` is being written must be seen by the next ``list_updates`` (read-your-writes
    covers aliases, whatever the target's queue was made for first)."""
    backend = _GatedUpdates()
    config = GuardConfig(methods={"save_task_update": MethodConfig(ack="enqueue")})
    store = guard(backend, registry=CollectorRegistry(), config=config)
    async with store:
        committing = asyncio.create_task(store.save_update(update("u1", 1)))
        await backend.started.wait()  # u1 is being written (its caller not answered yet)
        await store.save_task_update(update("u2", 2))  # acknowledged once queued
        reading = asyncio.create_task(store.list_updates("s1"))
        await backend.started.wait()
        backend.gate.set()
        assert "u2" in [u.update_id for u in await reading]
        await committing


@pytest.mark.asyncio
async def test_a_group_commit_write_queued_behind_a_write_behind_alias_goes_out_at_once() -> None:
    """The opposite mix: ``save_task_update`` (acknowledged at enqueue) made the shared queue, and
    waits for its batch timer; a ``save_update`` (group commit) joining it is written at once, not
    after the write-behind window, since its caller waits for the commit."""
    backend = InMemoryStateStore()
    config = GuardConfig(
        batching=BatchConfig(max_delay=60.0),
        methods={"save_task_update": MethodConfig(ack="enqueue")},
    )
    store = guard(backend, registry=CollectorRegistry(), config=config)
    async with store:
        await store.save_task_update(update("u1", 1))  # queued; its batch waits up to 60 s
        await asyncio.wait_for(store.save_update(update("u2", 2)), 10.0)
        stored = [u.update_id for u in await backend.list_updates("s1")]
        assert stored == ["u1", "u2"]


@pytest.mark.asyncio
async def test_a_close_right_after_an_outage_waits_out_the_open_breaker(tmp_path: Path) -> None:
    """The breaker opened during the outage and stays open for 30 s; the close's 5 s budget is
    used to probe it (with backoff) and deliver every held write once the backend is back."""
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    config = fast_config(
        breaker=BreakerConfig(minimum_calls=2, window_size=4, open_duration=30.0),
        batching=BatchConfig(),
        dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite"), drain_timeout=5.0),
    )
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    for index in range(20):
        await store.save_memory_state(f"k{index}", {"v": index})
        await store.save_event(event("t1", index))
    assert controller(store).breaker.remaining_open() > 20
    assert controller(store).dead_letters is not None
    assert controller(store).dead_letters.depth == 40
    fault_injector(faulty).plan = FaultPlan()  # the backend is back; the breaker is still open
    await controller(store).aclose()
    backend = controller(store).store
    assert len(await backend.load_history("t1")) == 20
    assert [await backend.load_memory_state(f"k{index}") for index in range(20)] == [
        {"v": index} for index in range(20)
    ]


@pytest.mark.asyncio
async def test_a_memory_only_buffer_warns_once_at_start_and_counts_its_loss_once_at_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="guarded")
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    config = GuardConfig(dead_letter=DeadLetterConfig(path=None, drain_timeout=0.2))
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    started = [r for r in caplog.records if r.name.startswith("guarded") and r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in started] == [
        "dead-letter buffer of store 'default' is in memory only (dead_letter.path=None): writes held "
        "during an outage die with the process"
    ]
    for index in range(3):
        await store.save_memory_state(f"k{index}", {"v": index})
    caplog.clear()
    await controller(store).aclose()
    about_closing = [r for r in caplog.records if r.name == "guarded.durability"]
    assert [r.levelno for r in about_closing] == [logging.ERROR]
    assert "3 undelivered" in about_closing[0].getMessage()
    assert "lost" in about_closing[0].getMessage()
    assert not [r for r in caplog.records if "kept" in r.getMessage() and "next" in r.getMessage()]


@pytest.mark.asyncio
async def test_a_guard_collected_unclosed_with_held_writes_says_how_many_and_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="guarded")
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    config = fast_config(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    store = guard(faulty, registry=CollectorRegistry(), config=config)
    await store.save_memory_state("k", {"v": 1})
    await store.save_memory_state("j", {"v": 2})
    del store
    gc.collect()
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "guard_not_closed"]
    message = record.getMessage()
    assert "was garbage-collected" in message
    assert "2 acknowledged writes" in message
    assert str(tmp_path) in message


@pytest.mark.asyncio
@pytest.mark.parametrize("use_artifacts", [False, True])
async def test_a_closed_guard_over_a_store_with_an_artifact_store_is_collected(use_artifacts: bool) -> None:
    """A store with an ``artifact_store`` (the reference, PostgreSQL) gets a guarded artifact store
    with durability of its own at open; that must not keep the guard alive once it is closed and
    dropped (a process that makes guards as it goes must not grow)."""
    store = guard(InMemoryStateStore(), registry=CollectorRegistry(), config=fast_config())
    await store.save_memory_state("k", {"v": 1})
    if use_artifacts:
        artifacts = store.artifact_store
        await artifacts.put_text("hello", namespace="n")
        del artifacts
    await controller(store).aclose()
    core = weakref.ref(core_of(store))
    del store
    gc.collect()
    assert core() is None, "the closed guard was not collected"


@pytest.mark.asyncio
async def test_guards_made_and_closed_one_after_another_leave_nothing_of_themselves_behind() -> None:
    """A process that makes guards as it goes (one per tenant, a test suite) must not grow with
    them: after warm-up, 20 more guards made, used and closed leave no core or durability behind,
    and fewer functions and closure cells than guards (each guard used to leave about 39 functions
    in a registry of argument getters). Cancelled timers wait in the event loop until its own
    clean-up and are not counted."""

    async def one(index: int) -> None:
        store = guard(
            InMemoryStateStore(), name=f"made-{index}", registry=CollectorRegistry(), spill_path=None
        )
        await store.save_memory_state("k", {"v": index})
        await controller(store).aclose()

    def census() -> Counter[str]:
        # Until a pass finds nothing: finalizers run by one pass (weak-keyed registries, the
        # check that a guard was closed) can leave more garbage for the next.
        for _ in range(10):
            if not gc.collect():
                break
        return Counter(type(found).__name__ for found in gc.get_objects())

    for index in range(5):
        await one(index)
    before = census()
    for index in range(5, 25):
        await one(index)
    grown = census() - before
    assert (grown["GuardCore"], grown["Durability"]) == (0, 0), grown.most_common(8)
    assert grown["function"] < 20, grown.most_common(8)
    assert grown["cell"] < 20, grown.most_common(8)


@pytest.mark.asyncio
async def test_a_guard_closed_properly_reports_nothing_when_collected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="guarded")
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    store = guard(faulty, registry=CollectorRegistry(), config=fast_config(dead_letter=DeadLetterConfig()))
    await store.save_memory_state("k", {"v": 1})
    fault_injector(faulty).plan = FaultPlan()
    await controller(store).aclose()
    del store
    gc.collect()
    assert [r for r in caplog.records if getattr(r, "event", None) == "guard_not_closed"] == []


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestWarning"
)  # the module's asyncio mark; this one runs its own loop
def test_an_event_loop_shut_down_under_an_unclosed_guard_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="guarded")
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE)
    config = fast_config(dead_letter=DeadLetterConfig(path=str(tmp_path / "dlq.sqlite")))
    store = guard(faulty, registry=CollectorRegistry(), config=config)

    async def main() -> None:
        await store.save_memory_state("k", {"v": 1})

    asyncio.run(main())
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "guard_not_closed"]
    assert "event loop is shutting down" in record.getMessage()
    assert "1 in spill file" in record.getMessage()


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", ["circuit_open", "backend_error"])
async def test_failed_calls_leave_no_reference_cycles(failure: str) -> None:
    """A failed call's error references the traceback whose frames reference the call: kept on the
    call, it made a reference cycle per failed call that only the cyclic garbage collector frees.
    During an outage every call fails, and those collections (of everything the process holds)
    cost the held-write path about a fifth of its time."""
    faulty = FaultyStore(InMemoryStateStore(), OUTAGE if failure == "backend_error" else FaultPlan())
    store = guard(
        faulty,
        name=f"cycles-{failure}",
        registry=CollectorRegistry(),
        config=fast_config(dead_letter=DeadLetterConfig(path=None, drain_timeout=0), log_interval=3600),
    )
    no_background_replay(store)
    try:
        if failure == "circuit_open":
            controller(store).breaker.force_open()

        async def calls(round_: int) -> None:
            for index in range(10):
                await store.save_memory_state(f"k{round_}-{index}", {"i": index})
                await store.load_memory_state(f"k{round_}-{index}")
                await store.list_tasks("s1")

        await calls(0)  # first calls build what later ones reuse
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection frees is kept in gc.garbage to look at
        try:
            await calls(1)
            gc.collect()
            left = Counter(
                type(thing).__name__
                for thing in gc.garbage
                if isinstance(thing, Call | BaseException | types.FrameType | types.TracebackType)
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == Counter()  # before: each of the 30 failed calls left its call, error, frames
        assert (await controller(store).dead_letters.stats()).depth == 20
    finally:
        await controller(store).aclose()
