"""Artifacts are dead-lettered like every other write, against the in-memory
store with injected faults: an artifact put the backend cannot take is kept in this process (its
reference valid at once) and held in the artifact spill file, then replayed into the backend's
artifact store under the same content-addressed id; within ``artifacts.spill_max_bytes``.
The PostgreSQL outage and process-exit scenarios are in tests/postgres/test_artifact_durability.py.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.backends.memory_artifacts import artifact_id
from guarded.config import ArtifactFallbackConfig, DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer
from guarded.errors import WriteNotKeptError
from guarded.guard import artifact_spill_path, controller, guard
from guarded.models import ArtifactScope
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.support.metrics import calls, sample

from .support import ATTEMPT, DEADLINE, fast_config

PUTS = ["artifact_store.put_bytes", "artifact_store.put_text"]
OUTAGE = FaultPlan.always(Fault.error_before(ConnectionRefusedError("database down")), methods=PUTS)
DOWN = FaultPlan.always(Fault.error_before(ConnectionRefusedError("database down")))
RECOVERED = FaultPlan()
SCOPE = ArtifactScope(tenant_id="acme", session_id="s1", trace_id="t1")
CHART = bytes(range(256)) * 8


def config(path: Path | None, *, drain_timeout: float = 10.0, slow: bool = False, **artifacts: Any) -> Any:
    """Dead letters on (spilled to ``path``), the artifact settings given; ``slow``: timeouts long
    enough for a deliberately slow call to finish."""
    return fast_config(
        attempt=2.0 if slow else ATTEMPT,
        deadline=4.0 if slow else DEADLINE,
        dead_letter=DeadLetterConfig(
            path=str(path) if path else None, replay_rate=10_000, drain_timeout=drain_timeout
        ),
        artifacts=ArtifactFallbackConfig(**artifacts),
    )


def guarded_faulty(
    path: Path | None, *, slow: bool = False, **artifacts: Any
) -> tuple[Any, InMemoryStateStore, Any, CollectorRegistry]:
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, FaultPlan())
    store = guard(faulty, registry=registry, config=config(path, slow=slow, **artifacts))
    return store, backend, fault_injector(faulty), registry


def held(store: Any) -> DeadLetterBuffer:
    """The buffer of the guard's artifact puts."""
    buffer = controller(store).artifact_dead_letters
    assert buffer is not None
    return buffer


async def until(condition: Any, seconds: float = 20.0) -> None:
    """Poll ``condition()`` (a coroutine function) until it is true, for at most ``seconds``."""
    async with asyncio.timeout(seconds):
        while not await condition():  # noqa: ASYNC110 - polling a store, no event to wait on
            await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_put_the_backend_cannot_take_is_held_and_replayed_under_the_same_id(tmp_path: Path) -> None:
    store, backend, injector, registry = guarded_faulty(tmp_path / "dlq-{name}.sqlite")
    injector.plan = OUTAGE
    ref = await store.artifact_store.put_bytes(
        CHART,
        mime_type="image/png",
        filename="chart.png",
        namespace="charts",
        scope=SCOPE,
        meta={"tool": "plot", "points": [1, 2.5]},
    )
    text_ref = await store.artifact_store.put_text("# report\n\u2603", mime_type="text/markdown", scope=SCOPE)

    assert ref.id == artifact_id(CHART, "charts")  # content-addressed, valid at once
    assert text_ref.id == artifact_id("# report\n\u2603".encode(), None)
    assert calls(registry, "artifact_store.put_bytes", "dead_lettered") == 1
    assert calls(registry, "artifact_store.put_text", "dead_lettered") == 1
    assert calls(registry, "artifact_store.put_bytes", "fallback") == 0
    assert held(store).depth == 2
    others = controller(store).dead_letters
    assert others is not None
    assert others.depth == 0  # a buffer (and spill file) of their own
    assert await backend.artifact_store.exists(ref.id) is False
    assert await store.artifact_store.get(ref.id) == CHART  # served from this process meanwhile

    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.get(ref.id) == CHART
    assert await backend.artifact_store.get(text_ref.id) == "# report\n\u2603".encode()
    stored = await backend.artifact_store.get_ref(ref.id)
    assert stored is not None
    assert stored.id == ref.id  # the replayed put yields the reference the caller already has
    assert (stored.mime_type, stored.filename, stored.namespace, stored.sha256) == (
        "image/png",
        "chart.png",
        "charts",
        ref.sha256,
    )
    assert stored.scope == SCOPE
    assert stored.source == {"tool": "plot", "points": [1, 2.5]}
    assert (await backend.artifact_store.get_ref(text_ref.id)).mime_type == "text/markdown"  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_the_background_replay_delivers_once_the_backend_recovers(tmp_path: Path) -> None:
    store, backend, injector, _ = guarded_faulty(tmp_path / "dlq.sqlite")
    injector.plan = OUTAGE
    ref = await store.artifact_store.put_bytes(b"background", scope=SCOPE)
    direct = injector.calls("artifact_store.put_bytes")

    async def replay_failed() -> bool:
        return bool(injector.calls("artifact_store.put_bytes") > direct)

    await until(replay_failed)  # the background replay tried while the backend was still down
    injector.plan = RECOVERED

    async def delivered() -> bool:
        return await backend.artifact_store.get(ref.id) == b"background"

    await until(delivered)  # no drain: the replay started by the put delivers it
    await until(lambda: _is_empty(held(store)))
    await controller(store).aclose()


async def _is_empty(buffer: DeadLetterBuffer) -> bool:
    return buffer.is_empty


@pytest.mark.asyncio
async def test_leaving_the_guard_delivers_held_artifacts(tmp_path: Path) -> None:
    store, backend, injector, _ = guarded_faulty(tmp_path / "dlq.sqlite")
    async with store:
        injector.plan = OUTAGE
        ref = await store.artifact_store.put_text("kept through the outage")
        injector.plan = RECOVERED
    assert await backend.artifact_store.get(ref.id) == b"kept through the outage"


@pytest.mark.asyncio
async def test_what_a_closed_guard_could_not_deliver_a_new_guard_on_the_same_path_delivers(
    tmp_path: Path,
) -> None:
    spill = tmp_path / "dlq-{name}.sqlite"
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, DOWN)
    first = guard(faulty, registry=registry, config=config(spill, drain_timeout=0.2))
    refs = [await first.artifact_store.put_bytes(f"artifact {n}".encode(), scope=SCOPE) for n in range(5)]
    assert calls(registry, "artifact_store.put_bytes", "dead_lettered") == 5
    await controller(first).aclose()  # still down: nothing delivered, all left in the spill file
    assert not any([await backend.artifact_store.exists(ref.id) for ref in refs])

    fault_injector(faulty).plan = RECOVERED
    again = guard(faulty, registry=CollectorRegistry(), config=config(spill))
    async with again:  # entering opens the artifact spill file and replays what waits there
        pass
    for number, ref in enumerate(refs):
        assert await backend.artifact_store.get(ref.id) == f"artifact {number}".encode()


class NamedStore(InMemoryStateStore):
    """An in-memory store that says which database it is, as PostgresStateStore does (and, as a
    database, that it keeps its data across processes)."""

    durable_across_processes = True

    def __init__(self, identity: str) -> None:
        super().__init__()
        self.target_identity = identity


@pytest.mark.asyncio
async def test_held_artifacts_are_only_ever_replayed_into_their_own_target(tmp_path: Path) -> None:
    spill = tmp_path / "dlq-{name}.sqlite"
    first_db = NamedStore("memory://a")
    faulty = FaultyStore(first_db, DOWN)
    first = guard(faulty, registry=CollectorRegistry(), config=config(spill, drain_timeout=0.1))
    ref = await first.artifact_store.put_bytes(b"belongs to a")
    assert held(first).target == "memory://a artifact_store"
    await controller(first).aclose()

    other_db = NamedStore("memory://b")
    other: Any = guard(other_db, registry=CollectorRegistry(), config=config(spill))
    async with other:
        assert held(other).target == "memory://b artifact_store"
        assert held(other).depth == 0  # the file of "a" is left alone
    assert await other_db.artifact_store.exists(ref.id) is False

    again: Any = guard(first_db, registry=CollectorRegistry(), config=config(spill))
    async with again:
        pass
    assert await first_db.artifact_store.get(ref.id) == b"belongs to a"


def refused_total(registry: CollectorRegistry, method: str, reason: str) -> float:
    return sample(registry, "guarded_deadletter_refused_total", store="default", method=method, reason=reason)


def refusal_records(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [record for record in records if getattr(record, "event", None) == "deadletter_refused"]


@pytest.mark.asyncio
async def test_an_artifact_beyond_the_spill_cap_is_refused_and_nothing_held_is_evicted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, backend, injector, registry = guarded_faulty(tmp_path / "dlq.sqlite", spill_max_bytes=8 * 1024)
    injector.plan = OUTAGE
    small = await store.artifact_store.put_bytes(b"s" * 1000)
    with caplog.at_level(logging.ERROR), pytest.raises(WriteNotKeptError, match="not kept"):
        await store.artifact_store.put_bytes(b"L" * 20_000)  # 27 KB encoded: past the 8 KB cap
    assert calls(registry, "artifact_store.put_bytes", "dead_lettered") == 1
    assert calls(registry, "artifact_store.put_bytes", "refused") == 1
    assert calls(registry, "artifact_store.put_bytes", "fallback") == 0
    assert refused_total(registry, "put_bytes", "disk_cap") == 1
    [record] = refusal_records(caplog.records)
    assert record.levelno == logging.ERROR
    assert held(store).depth == 1  # the small one, acknowledged, is still held

    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.get(small.id) == b"s" * 1000
    assert await backend.artifact_store.exists(artifact_id(b"L" * 20_000)) is False  # never acknowledged
    # Delivered artifacts free the cap again.
    injector.plan = OUTAGE
    again = await store.artifact_store.put_bytes(b"a" * 5000)
    assert calls(registry, "artifact_store.put_bytes", "dead_lettered") == 2
    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.exists(again.id) is True


@pytest.mark.lenient  # as in production: the refused put returns
@pytest.mark.asyncio
async def test_outside_strict_mode_a_refused_put_answers_the_reference_of_its_copy_in_this_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """PenguiFlow uses the reference a put answers (never ``None``): a refused put still answers
    the reference of the copy this process keeps, readable here, but its outcome is ``refused``,
    counted and logged at ERROR, never ``fallback`` nor ``dead_lettered``."""
    store, _, injector, registry = guarded_faulty(tmp_path / "dlq.sqlite", spill_max_bytes=8 * 1024)
    injector.plan = OUTAGE
    with caplog.at_level(logging.ERROR):
        ref = await store.artifact_store.put_text("L" * 20_000)
    assert ref is not None
    assert ref.id == artifact_id(b"L" * 20_000)
    assert await store.artifact_store.get(ref.id) == b"L" * 20_000  # readable in this process
    assert calls(registry, "artifact_store.put_text", "refused") == 1
    assert calls(registry, "artifact_store.put_text", "fallback") == 0
    assert calls(registry, "artifact_store.put_text", "dead_lettered") == 0
    assert refused_total(registry, "put_text", "disk_cap") == 1
    assert held(store).depth == 0
    levels = {
        (getattr(record, "event", None), getattr(record, "outcome", None)): record.levelno
        for record in caplog.records
    }
    assert levels[("deadletter_refused", None)] == logging.ERROR
    assert levels[("statestore_call_failed", "refused")] == logging.ERROR


@pytest.mark.asyncio
@pytest.mark.parametrize("settings", ["spill cap 0", "dead letters off"])
async def test_without_artifact_durability_a_put_the_backend_cannot_take_is_refused(
    tmp_path: Path, settings: str
) -> None:
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, OUTAGE)
    if settings == "spill cap 0":
        chosen = config(tmp_path / "dlq.sqlite", spill_max_bytes=0)
    else:
        chosen = fast_config(dead_letter=DeadLetterConfig(enabled=False, path=None))
    store = guard(faulty, registry=registry, config=chosen)
    with pytest.raises(WriteNotKeptError, match="not kept"):
        await store.artifact_store.put_bytes(b"x")
    assert calls(registry, "artifact_store.put_bytes", "refused") == 1
    assert calls(registry, "artifact_store.put_bytes", "fallback") == 0
    assert refused_total(registry, "put_bytes", "disk_cap") == 1
    assert controller(store).artifact_dead_letters is None
    fault_injector(faulty).plan = RECOVERED
    assert await controller(store).drain(timeout=1) == 0
    assert await backend.artifact_store.exists(artifact_id(b"x")) is False


@pytest.mark.asyncio
@pytest.mark.parametrize("durable", [True, False], ids=["memory_only_by_choice", "store_keeps_nothing"])
async def test_held_in_memory_artifacts_are_acknowledged_within_the_cap_and_refused_past_it(
    durable: bool,
) -> None:
    """Without a spill file (``dead_letter.path=None``, or a store that keeps nothing across
    processes, whose held artifacts are worth as much as its own data) artifacts are held in
    memory, as the store's other writes are: acknowledged (``dead_lettered``) within
    ``artifacts.spill_max_bytes`` and delivered when the backend recovers; past it refused
    (``memory_full``), never kept in this process only."""
    registry = CollectorRegistry()
    backend = InMemoryStateStore()
    faulty = FaultyStore(backend, OUTAGE, durable_across_processes=durable)
    path = None if durable else tmp_spill_that_must_not_be_used()
    store = guard(faulty, registry=registry, config=config(path, spill_max_bytes=8 * 1024))
    small = await store.artifact_store.put_bytes(b"s" * 1000)
    with pytest.raises(WriteNotKeptError, match="not kept"):
        await store.artifact_store.put_bytes(b"L" * 20_000)
    assert held(store).path is None
    assert calls(registry, "artifact_store.put_bytes", "dead_lettered") == 1
    assert calls(registry, "artifact_store.put_bytes", "refused") == 1
    assert refused_total(registry, "put_bytes", "memory_full") == 1
    fault_injector(faulty).plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.get(small.id) == b"s" * 1000
    assert await backend.artifact_store.exists(artifact_id(b"L" * 20_000)) is False


def tmp_spill_that_must_not_be_used() -> Path:
    """A spill path a store that keeps nothing across processes never uses (no file is made)."""
    return Path("/nonexistent/guarded-test/dlq.sqlite")


@pytest.mark.asyncio
async def test_identical_puts_are_held_once() -> None:
    store, backend, injector, _ = guarded_faulty(None)  # memory only: still delivered on recovery
    injector.plan = OUTAGE
    first = await store.artifact_store.put_bytes(b"same", namespace="ns")
    second = await store.artifact_store.put_bytes(b"same", namespace="ns")
    assert first.id == second.id
    assert held(store).depth == 1
    injector.plan = RECOVERED
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.get(first.id) == b"same"


@pytest.mark.asyncio
async def test_a_deleted_artifact_is_not_brought_back_by_its_replay(tmp_path: Path) -> None:
    store, backend, injector, _ = guarded_faulty(tmp_path / "dlq.sqlite")
    injector.plan = OUTAGE
    ref = await store.artifact_store.put_bytes(b"to be deleted")
    assert held(store).depth == 1
    injector.plan = RECOVERED
    assert await store.artifact_store.delete(ref.id) is True
    assert held(store).depth == 0
    assert await controller(store).drain(timeout=10) == 0
    assert await backend.artifact_store.exists(ref.id) is False
    assert await store.artifact_store.exists(ref.id) is False


class SlowPut(FaultPlan):
    """The next ``put_bytes`` reaches the store only after ``seconds``; other calls go through."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.used = False

    def choose(self, method: str, call_index: int, index: int) -> Fault:
        if method == "artifact_store.put_bytes" and not self.used:
            self.used = True
            return Fault.delay(self.seconds)
        return Fault.ok()


@pytest.mark.asyncio
async def test_a_delete_during_the_replay_of_its_put_lands_after_it(tmp_path: Path) -> None:
    store, backend, injector, _ = guarded_faulty(tmp_path / "dlq.sqlite", slow=True)
    injector.plan = OUTAGE
    ref = await store.artifact_store.put_bytes(b"deleted while replayed")
    before = injector.calls("artifact_store.put_bytes")

    injector.plan = SlowPut(0.3)  # the replay is slow to reach the store
    drain = asyncio.ensure_future(controller(store).drain(timeout=10))
    async with asyncio.timeout(10):
        while injector.calls("artifact_store.put_bytes") <= before:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.001)
    assert await store.artifact_store.delete(ref.id) is True
    assert await drain == 0
    assert await backend.artifact_store.exists(ref.id) is False


@pytest.mark.lenient
@pytest.mark.asyncio
async def test_bad_artifact_data_is_still_rejected_not_held(tmp_path: Path) -> None:
    store, _, _, registry = guarded_faulty(tmp_path / "dlq.sqlite")
    assert await store.artifact_store.put_bytes(b"x", meta={"bad": float("nan")}) is None
    assert calls(registry, "artifact_store.put_bytes", "rejected") == 1
    buffer = controller(store).artifact_dead_letters
    assert buffer is not None
    assert buffer.is_empty


@pytest.mark.asyncio
async def test_held_artifacts_count_in_the_stores_dead_letter_metrics(tmp_path: Path) -> None:
    store, _, injector, registry = guarded_faulty(tmp_path / "dlq.sqlite")
    injector.plan = OUTAGE
    await store.artifact_store.put_text("counted")
    enqueued = registry.get_sample_value(
        "guarded_deadletter_enqueued_total", {"store": "default", "method": "put_text"}
    )
    assert enqueued == 1
    assert registry.get_sample_value("guarded_deadletter_depth", {"store": "default"}) == 1
    injector.plan = RECOVERED
    await controller(store).aclose()
    replayed = registry.get_sample_value(
        "guarded_deadletter_replayed_total", {"store": "default", "method": "put_text"}
    )
    assert replayed == 1


def test_the_artifact_spill_file_sits_beside_the_dead_letter_file() -> None:
    assert artifact_spill_path("/var/lib/app/dlq-{name}.sqlite") == "/var/lib/app/dlq-{name}-artifacts.sqlite"
    assert artifact_spill_path("/var/lib/app.d/dlq") == "/var/lib/app.d/dlq-artifacts"
    assert artifact_spill_path("dlq.db") == "dlq-artifacts.db"
    assert artifact_spill_path(None) is None


@pytest.mark.asyncio
async def test_the_default_spill_path_gets_an_artifact_file_of_its_own(tmp_path: Path) -> None:
    store, _, injector, _ = guarded_faulty(tmp_path / "{name}.sqlite")
    injector.plan = OUTAGE
    await store.artifact_store.put_bytes(b"on disk")
    buffer = controller(store).artifact_dead_letters
    assert buffer is not None
    assert buffer.path == str(tmp_path / "default-artifacts.sqlite")
    injector.plan = RECOVERED
    await controller(store).aclose()
