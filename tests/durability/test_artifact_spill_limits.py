"""At the artifact spill file's limits an artifact put is refused, never acknowledged from this
process's memory only: a process puts artifacts while PostgreSQL is down, past
``artifacts.spill_max_bytes`` or onto a full disk (a small tmpfs), in strict mode, and is
SIGKILLed. Every put either raised ``WriteNotKeptError`` (outcome ``refused``, counted by reason)
or, once the server is back and a guard of this process drained the killed process's artifact
spill file, is in PostgreSQL under the id it answered. Own server (it is stopped).

Run as a script, this module is the process the test kills::

    python -m tests.durability.test_artifact_spill_limits DSN SCHEMA SPILL SPILL_MAX_BYTES

With the database down, :data:`WRITERS` concurrent writers put :data:`COUNT` artifacts through a
strict ``guard(PostgresStateStore.lazy(DSN))``, print one JSON line (what was acknowledged, what
was refused, the outcomes and the refusals by reason) and sleep until killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import ArtifactFallbackConfig, GuardConfig
from guarded.errors import WriteNotKeptError
from guarded.guard import controller, guard
from guarded.testing.postgres import EmbeddedPostgres
from tests.killed_process import report_then_kill
from tests.postgres._outages import drain_all, open_store, outage_config, pool_settings

from .test_spill_limits import small_tmpfs

WRITERS, COUNT = 4, 40
"""40 artifacts of 20 KB (27 KB held, base64) from 4 concurrent writers: about 1.1 MB."""
SPILL_CAP = 200_000
"""The artifact spill cap of the ``spill_cap`` case: room for 7 of them."""
NAME = "artifacts"
NAMESPACE = "limits"


def content(number: int) -> bytes:
    return random.Random(number).randbytes(20_000)


def config(spill: Path | str, spill_max_bytes: int, *, strict: bool = False) -> GuardConfig:
    return outage_config(spill).model_copy(
        update={"artifacts": ArtifactFallbackConfig(spill_max_bytes=spill_max_bytes), "strict": strict}
    )


async def stored_artifacts(dsn: str, schema: str) -> dict[str, str]:
    """Artifact id -> sha256 of what PostgreSQL holds, read behind the store's back."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(f'SELECT artifact_id, sha256 FROM "{schema}".artifacts')
    finally:
        await conn.close()
    return {row["artifact_id"]: row["sha256"] for row in rows}


@pytest.mark.asyncio
@pytest.mark.parametrize("limit", ["spill_cap", "full_disk"])
async def test_a_killed_process_acknowledged_no_artifact_it_had_not_committed(
    limit: str, server: EmbeddedPostgres, schema_name: str, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        if limit == "full_disk":
            disk = stack.enter_context(small_tmpfs(tmp_path))  # 256 KiB
            spill, cap = disk / "dlq-{name}.sqlite", ArtifactFallbackConfig().spill_max_bytes
        else:
            (tmp_path / "spill").mkdir()
            spill, cap = tmp_path / "spill" / "dlq-{name}.sqlite", SPILL_CAP
        await asyncio.to_thread(server.stop)  # down for the whole life of the process
        arguments = [server.dsn, schema_name, str(spill), str(cap)]
        report: dict[str, Any] = await asyncio.to_thread(
            report_then_kill, __name__, arguments, tmp_path / "worker.log", timeout=180
        )
        acknowledged = {item["id"]: item["sha256"] for item in report["acknowledged"]}
        assert report["errors"] == []
        assert len(acknowledged) + report["refused"] == COUNT

        if limit == "full_disk":  # the operator grows the disk
            grow = ["mount", "-o", "remount,size=16m", str(spill.parent)]
            await asyncio.to_thread(subprocess.run, grow, check=True)
        await asyncio.to_thread(server.start)
        backend = await open_store(server.dsn, schema_name)
        drainer = guard(backend, name=NAME, registry=CollectorRegistry(), config=config(spill, cap))
        async with drainer as store:
            assert await drain_all(store, seconds=120) == 0
        await backend.close()

    found = await stored_artifacts(server.dsn, schema_name)
    lost = [artifact for artifact, sha256 in acknowledged.items() if found.get(artifact) != sha256]
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged artifacts not in PostgreSQL"
    if limit == "spill_cap":  # a put refused at the cap was never committed anywhere
        assert set(found) == set(acknowledged)
    assert acknowledged, "the first artifacts fit"
    assert report["refused"] > 0, "1.1 MB cannot fit: some puts must be refused"
    outcomes = report["outcomes"]
    assert outcomes.get("dead_lettered", 0) == len(acknowledged)
    assert outcomes.get("refused", 0) == report["refused"]
    assert "fallback" not in outcomes
    expected_reason = "disk_cap" if limit == "spill_cap" else "disk_full"
    assert report["reasons"].get(expected_reason, 0) > 0, report["reasons"]
    assert sum(report["reasons"].values()) == report["refused"]


async def _put_through_an_outage(dsn: str, schema: str, spill: str, spill_max_bytes: int) -> None:
    backend = PostgresStateStore.lazy(
        dsn, schema=schema, registry=CollectorRegistry(), stats_interval=None, pool=pool_settings()
    )
    registry = CollectorRegistry()
    strict = config(spill, spill_max_bytes, strict=True)
    store: Any = guard(backend, name=NAME, registry=registry, config=strict)
    acknowledged: list[dict[str, Any]] = []
    refused: list[str] = []
    errors: list[str] = []

    async def writer(first: int) -> None:
        for number in range(first, COUNT, WRITERS):
            data = content(number)
            try:
                ref = await store.artifact_store.put_bytes(data, namespace=NAMESPACE, meta={"n": number})
            except WriteNotKeptError as exc:
                refused.append(str(exc))
            except Exception as exc:  # reported: the test fails on any
                errors.append(repr(exc))
            else:
                assert ref.sha256 == hashlib.sha256(data).hexdigest()
                acknowledged.append({"n": number, "id": ref.id, "sha256": ref.sha256})

    await asyncio.gather(*(writer(first) for first in range(WRITERS)))
    outcomes: dict[str, int] = {}
    for (method, outcome), count in controller(store).stats().items():
        if method == "artifact_store.put_bytes" and count:
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    reasons: dict[str, int] = {}
    for family in registry.collect():
        for found in family.samples:
            if found.name == "guarded_deadletter_refused_total" and found.value:
                reasons[found.labels["reason"]] = reasons.get(found.labels["reason"], 0) + int(found.value)
    report = {
        "acknowledged": acknowledged,
        "refused": len(refused),
        "errors": errors,
        "outcomes": outcomes,
        "reasons": reasons,
    }
    print(json.dumps(report), flush=True)
    await asyncio.sleep(3600)  # until the test kills the process


if __name__ == "__main__":
    dsn_arg, schema_arg, spill_arg, cap_arg = sys.argv[1:5]
    asyncio.run(_put_through_an_outage(dsn_arg, schema_arg, spill_arg, int(cap_arg)))
