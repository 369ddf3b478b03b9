"""Artifacts are dead-lettered like every other write, against a real PostgreSQL.

An artifact put the database cannot take is kept in the process (its reference valid at once)
and held in the artifact spill file; once the database is back it is replayed into the
``artifacts`` table under the same content-addressed id. The scenarios: an outage injected in
front of the store, and a process that puts artifacts while the server is stopped and is then
SIGKILLed: a new process on the same spill path delivers them, readable by their original ids.
The in-memory versions are in tests/guard/test_artifact_durability.py.

Run as a script, this module is the process the crash test kills::

    python -m tests.postgres.test_artifact_durability DSN SCHEMA SPILL COUNT

With the database down, it puts ``COUNT`` artifacts (and one text) through
``guard(PostgresStateStore.lazy(DSN))``, prints one JSON line (their references, the outcomes,
the depth of the artifact buffer) and sleeps until killed.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.memory_artifacts import artifact_id
from guarded.backends.postgres import PostgresStateStore
from guarded.config import ArtifactFallbackConfig, GuardConfig
from guarded.guard import controller, guard
from guarded.models import ArtifactScope
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from guarded.testing.postgres import EmbeddedPostgres, embedded_postgres

from ..killed_process import report_then_kill
from ._outages import drain_all, open_store, outage_config, pool_settings

PUTS = ["artifact_store.put_bytes", "artifact_store.put_text"]
NAMESPACE = "crash.tool"
TEXT = "# report \u2603\nwritten while the database was down\x00"


def content(number: int) -> bytes:
    """Deterministic binary contents of various sizes (the last one 1 MiB)."""
    size = 1024 * 1024 if number == 0 else 100 + number * 997
    return random.Random(number).randbytes(size)


def scope(number: int) -> ArtifactScope:
    return ArtifactScope(tenant_id="acme", session_id="s1", trace_id=f"t{number}")


def artifact_config(spill: Path | str) -> GuardConfig:
    config = outage_config(spill)
    return config.model_copy(update={"artifacts": ArtifactFallbackConfig(spill_max_bytes=64 * 1024 * 1024)})


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    """A server of the test's own: it gets stopped."""
    with embedded_postgres(settings={"synchronous_commit": "on"}) as own:
        yield own


# --- an outage injected in front of the store -------------------------------------------------------


@pytest.mark.asyncio
async def test_artifacts_put_during_an_outage_reach_postgres_under_their_ids(
    store: PostgresStateStore, raw: asyncpg.Connection, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    faulty = FaultyStore(store, FaultPlan.always(Fault.error_before(ConnectionRefusedError), methods=PUTS))
    guarded: Any = guard(faulty, registry=registry, config=artifact_config(tmp_path / "dlq-{name}.sqlite"))
    refs = [
        await guarded.artifact_store.put_bytes(
            content(number), mime_type="application/octet-stream", namespace=NAMESPACE, scope=scope(number)
        )
        for number in range(3)
    ]
    text_ref = await guarded.artifact_store.put_text(TEXT, mime_type="text/markdown", scope=scope(9))
    stats = controller(guarded).stats()
    assert stats[("artifact_store.put_bytes", "dead_lettered")] == 3
    assert stats[("artifact_store.put_text", "dead_lettered")] == 1
    assert await raw.fetchval(f'SELECT count(*) FROM "{store.schema}".artifacts') == 0
    assert await guarded.artifact_store.get(refs[1].id) == content(1)  # from this process meanwhile

    fault_injector(faulty).plan = FaultPlan()
    assert await drain_all(guarded) == 0
    for number, ref in enumerate(refs):
        assert ref.id == artifact_id(content(number), NAMESPACE)
        assert await store.artifact_store.get(ref.id) == content(number)
        stored = await store.artifact_store.get_ref(ref.id)
        assert stored is not None
        assert (stored.id, stored.sha256, stored.size_bytes) == (ref.id, ref.sha256, ref.size_bytes)
        assert stored.scope == scope(number)
    assert await store.artifact_store.get(text_ref.id) == TEXT.encode("utf-8")
    assert await raw.fetchval(f'SELECT count(*) FROM "{store.schema}".artifacts') == 4
    await controller(guarded).aclose()


# --- a process killed during an outage -------------------------------------------------------------


def killed_process(dsn: str, schema: str, spill: Path, count: int) -> dict[str, Any]:
    """Run this module as a script, read the JSON line it prints once its puts are acknowledged,
    then SIGKILL it; returns that report."""
    arguments = [dsn, schema, str(spill), str(count)]
    report: dict[str, Any] = report_then_kill(
        "tests.postgres.test_artifact_durability", arguments, spill.with_suffix(".log"), timeout=120
    )
    return report


@pytest.mark.asyncio
async def test_artifacts_a_killed_process_put_during_an_outage_are_delivered_by_the_next(
    server: EmbeddedPostgres, tmp_path: Path
) -> None:
    spill = tmp_path / "dlq-{name}.sqlite"
    count = 4
    await asyncio.to_thread(server.stop)  # down for the whole life of the process
    report = await asyncio.to_thread(killed_process, server.dsn, "crash", spill, count)
    assert report["outcomes"] == {"artifact_store.put_bytes": count, "artifact_store.put_text": 1}
    assert report["depth"] == count + 1
    expected = {number: artifact_id(content(number), NAMESPACE) for number in range(count)}
    assert [ref["id"] for ref in report["refs"]] == [expected[number] for number in range(count)]
    assert report["text_id"] == artifact_id(TEXT.encode("utf-8"))

    await asyncio.to_thread(server.start)
    backend = await open_store(server.dsn, "crash")
    async with guard(
        backend, name="crash", registry=CollectorRegistry(), config=artifact_config(spill)
    ) as store:
        buffer = controller(store).artifact_dead_letters
        assert buffer is not None
        assert await drain_all(store) == 0
        assert buffer.is_empty

    reader = await open_store(server.dsn, "crash")  # a fresh connection: read what PostgreSQL holds
    try:
        for number, ref in enumerate(report["refs"]):
            assert await reader.artifact_store.get(ref["id"]) == content(number)
            stored = await reader.artifact_store.get_ref(ref["id"])
            assert stored is not None
            assert (stored.id, stored.sha256, stored.size_bytes) == (ref["id"], ref["sha256"], ref["size"])
            assert stored.namespace == NAMESPACE
            assert stored.scope is not None
            assert stored.scope.trace_id == f"t{number}"
            assert stored.source == {"n": number}
        assert await reader.artifact_store.get(report["text_id"]) == TEXT.encode("utf-8")
    finally:
        await reader.close()


async def _put_during_outage(dsn: str, schema: str, spill: str, count: int) -> None:
    backend = PostgresStateStore.lazy(
        dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, pool=pool_settings()
    )
    store: Any = guard(backend, name="crash", registry=CollectorRegistry(), config=artifact_config(spill))
    refs = []
    for number in range(count):
        ref = await store.artifact_store.put_bytes(
            content(number),
            mime_type="application/octet-stream",
            namespace=NAMESPACE,
            scope=scope(number),
            meta={"n": number},
        )
        refs.append({"id": ref.id, "sha256": ref.sha256, "size": ref.size_bytes})
    text_ref = await store.artifact_store.put_text(TEXT, mime_type="text/markdown")
    buffer = controller(store).artifact_dead_letters
    assert buffer is not None
    report = {
        "refs": refs,
        "text_id": text_ref.id,
        "outcomes": {
            method: count
            for (method, outcome), count in controller(store).stats().items()
            if outcome == "dead_lettered" and count
        },
        "depth": buffer.depth,
    }
    print(json.dumps(report), flush=True)
    await asyncio.sleep(3600)  # until the test kills the process


if __name__ == "__main__":
    dsn_arg, schema_arg, spill_arg, count_arg = sys.argv[1:5]
    asyncio.run(_put_during_outage(dsn_arg, schema_arg, spill_arg, int(count_arg)))
