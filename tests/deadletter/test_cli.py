"""``guarded dlq list|stats|replay|purge`` against real spill files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from guarded.cli import main
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer, SpillFile
from tests.deadletter import factories
from tests.deadletter.support import buffer, event

SECRET = "s3cr3t-payload"


def prepare(path: Path, *, events: int = 3, parked: int = 1) -> None:
    async def run() -> None:
        target = buffer(path)
        for index in range(events):
            await target.put(
                "save_event",
                (event("trace-1", index, note=SECRET),),
                {},
                scope="trace-1",
                stamp=index,
                error="ConnectionResetError",
            )
        await target.put(
            "save_memory_state",
            ("tenant:user:s", {"note": SECRET}),
            {},
            key="tenant:user:s",
            stamp=99,
            error="x",
        )
        for index in range(parked):
            await target.park("save_task", (), {"state": {"bad": SECRET}}, reason=f"bad data {index}")
        await target.aclose()

    asyncio.run(run())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def pending(path: Path) -> int:
    reader = SpillFile.open_read_only(str(path))
    try:
        return reader.totals().pending
    finally:
        reader.close()


def test_list_shows_metadata_but_no_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare(path)
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["SLOT", "SEQ", "METHOD", "KEY", "SCOPE", "AGE", "SIZE", "ERROR"]
    assert "save_event" in lines[1]
    assert "trace-1" in lines[1]
    assert "ConnectionResetError" in lines[1]
    assert '"tenant:user:s"' in out
    assert "4 of 4 pending write(s)" in out
    assert SECRET not in out

    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--limit", "2", "--show-payload")
    assert code == 0
    assert SECRET in out
    assert "2 of 4" in out


def test_list_json_and_parked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare(path, parked=2)
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--json")
    document = json.loads(out)
    assert code == 0
    assert document["kind"] == "pending"
    assert document["total"] == 4
    first = document["entries"][0]
    assert set(first) == {
        "slot",
        "file",
        "seq",
        "method",
        "key",
        "scope",
        "enqueued_at",
        "age_seconds",
        "size",
        "error",
    }
    assert (first["slot"], first["file"]) == (0, str(path))
    assert [entry["method"] for entry in document["entries"]] == ["save_event"] * 3 + ["save_memory_state"]
    assert SECRET not in out

    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--parked", "--json")
    document = json.loads(out)
    assert document["total"] == 2
    reasons = [entry["reason"] for entry in document["entries"]]
    assert reasons[0].startswith("bad data 0 (call not kept: save_task: state.task_id:")
    assert reasons[1].startswith("bad data 1")
    assert not any(entry["call_kept"] for entry in document["entries"])
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--parked")
    assert code == 0
    assert "REASON" in out
    assert "bad data 1" in out
    assert "lost" in out
    assert SECRET not in out


def test_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare(path)
    code, out, _ = run(capsys, "dlq", "stats", "--path", str(path), "--json")
    document = json.loads(out)
    assert code == 0
    assert document["pending"] == 4
    assert document["parked"] == 1
    assert document["by_method"]["save_event"]["pending"] == 3
    assert document["pending_bytes"] == sum(item["bytes"] for item in document["by_method"].values())
    code, out, _ = run(capsys, "dlq", "stats", "--path", str(path))
    assert code == 0
    assert "pending:     4" in out
    assert "save_memory_state" in out


def test_replay_into_a_factory_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare(path, parked=0)
    code, out, _ = run(
        capsys,
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "tests.deadletter.factories:async_memory_store",
    )
    assert code == 0, out
    assert "replayed 4 of 4" in out
    store = factories.BUILT[-1]
    history = asyncio.run(store.load_history("trace-1"))
    assert [item.payload["i"] for item in history] == [0, 1, 2]
    assert asyncio.run(store.load_memory_state("tenant:user:s")) == {"note": SECRET}
    assert pending(path) == 0


def test_replay_into_a_store_whose_backend_is_down_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.db"
    prepare(path, parked=0)
    code, out, err = run(
        capsys,
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "tests.deadletter.factories:down_store",
        "--json",
    )
    document = json.loads(out)
    assert code == 3  # the backend is unreachable (docs/cli.md)
    assert err.startswith("error: the store's backend is not answering; the replay stopped: ")
    assert document["replayed"] == 0
    assert document["remaining"] == 4
    assert document["stopped_early"]
    assert "ConnectionRefusedError" in document["last_error"]
    assert pending(path) == 4


def test_replay_including_parked_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"

    async def setup() -> None:
        target = buffer(path)
        await target.park("save_memory_state", ("k", {"v": 1}), {}, reason="backend said no")
        await target.aclose()

    asyncio.run(setup())
    code, out, _ = run(
        capsys,
        "dlq",
        "replay",
        "--path",
        str(path),
        "--store",
        "tests.deadletter.factories:memory_store",
        "--include-parked",
        "--rate",
        "1000",
    )
    assert code == 0, out
    assert "1 parked write(s) were moved back" in out
    assert asyncio.run(factories.BUILT[-1].load_memory_state("k")) == {"v": 1}


def test_purge_needs_confirmation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare(path)
    code, _, err = run(capsys, "dlq", "purge", "--path", str(path), "--pending")
    assert code == 2
    assert "--yes" in err
    code, _, err = run(capsys, "dlq", "purge", "--path", str(path), "--yes")
    assert code == 2
    assert "--pending" in err
    assert pending(path) == 4
    code, out, _ = run(capsys, "dlq", "purge", "--path", str(path), "--pending", "--yes", "--json")
    assert code == 0
    assert json.loads(out)["purged"] == 4
    code, out, _ = run(capsys, "dlq", "purge", "--path", str(path), "--parked", "--yes")
    assert code == 0
    assert "purged 1 parked write(s)" in out
    code, out, _ = run(capsys, "dlq", "stats", "--path", str(path), "--json")
    assert json.loads(out)["pending"] == 0
    assert json.loads(out)["parked"] == 0


def test_writers_refuse_a_file_held_by_a_live_buffer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.db"
    prepare(path)

    async def hold() -> None:
        target = buffer(path)
        await target.open()
        try:
            loop = asyncio.get_running_loop()
            code = await loop.run_in_executor(
                None, main, ["dlq", "purge", "--path", str(path), "--pending", "--yes"]
            )
            assert code == 1
            code = await loop.run_in_executor(None, main, ["dlq", "stats", "--path", str(path)])
            assert code == 0
        finally:
            await target.aclose()

    asyncio.run(hold())
    err = capsys.readouterr().err
    assert "in use by another process" in err
    assert "stop that process first" in err
    assert pending(path) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dlq", "list", "--path", "{missing}"], "no dead-letter spill file"),
        (["dlq", "stats", "--path", "{foreign}"], "not a guarded dead-letter spill file"),
        (["dlq", "replay", "--path", "{spill}", "--store", "no_such_module_xyz:make"], "cannot import"),
        (["dlq", "replay", "--path", "{spill}", "--store", "nocolon"], "invalid factory"),
        (
            ["dlq", "replay", "--path", "{spill}", "--store", "m:f", "--rate", "0"],
            "--rate: must be a positive number",
        ),
        (["dlq", "list", "--path", "{spill}", "--limit", "-1"], "--limit"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    spill = tmp_path / "dlq.db"
    prepare(spill, events=1, parked=0)
    foreign = tmp_path / "foreign.db"
    foreign.write_bytes(b"")
    import sqlite3

    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x)")
    names = {"missing": str(tmp_path / "missing.db"), "foreign": str(foreign), "spill": str(spill)}
    code, _, err = run(capsys, *[part.format(**names) for part in argv])
    assert code == 2
    assert message in err


def test_dlq_needs_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "dlq")
    assert code == 2
    assert "ACTION" in err


def prepare_slots(path: Path, targets: tuple[str | None, ...] = (None, None)) -> None:
    """One live buffer per target at once, so each takes a slot of its own; each holds 2 events."""

    async def setup() -> None:
        buffers = [
            DeadLetterBuffer(
                DeadLetterConfig(path=str(path)),
                store_name="cli",
                registry=CollectorRegistry(),
                target=target,
            )
            for target in targets
        ]
        for index, target_buffer in enumerate(buffers):
            for number in range(2):
                await target_buffer.put(
                    "save_event",
                    (event(f"trace-{index}", number),),
                    {},
                    scope=f"trace-{index}",
                    stamp=number,
                    error="x",
                )
        for target_buffer in buffers:
            await target_buffer.aclose()

    asyncio.run(setup())


def test_list_and_stats_see_every_slot_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare_slots(path)
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--json")
    document = json.loads(out)
    assert code == 0
    assert document["total"] == 4
    assert [(entry["slot"], entry["file"], entry["scope"]) for entry in document["entries"]] == [
        (0, str(path), "trace-0"),
        (0, str(path), "trace-0"),
        (1, f"{path}.1", "trace-1"),
        (1, f"{path}.1", "trace-1"),
    ]
    assert [file["path"] for file in document["files"]] == [str(path), f"{path}.1"]
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path))
    assert code == 0
    assert "4 of 4 pending write(s)" in out
    assert f"1 = {path}.1" in out
    code, out, _ = run(capsys, "dlq", "stats", "--path", str(path), "--json")
    document = json.loads(out)
    assert (code, document["pending"]) == (0, 4)
    assert [(file["slot"], file["pending"], file["in_use"]) for file in document["files"]] == [
        (0, 2, False),
        (1, 2, False),
    ]
    code, out, _ = run(capsys, "dlq", "stats", "--path", str(path))
    assert code == 0
    assert "dlq.db.1 " in out


def test_a_damaged_slot_file_gets_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dlq.db"
    prepare_slots(path)
    damaged = tmp_path / "dlq.db.1"
    for name in ("dlq.db.1-wal", "dlq.db.1-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    damaged.write_bytes(b"not a database at all " * 100)
    before = damaged.read_bytes()
    for command in ("list", "stats"):
        code, out, err = run(capsys, "dlq", command, "--path", str(path))
        assert code == 2
        assert len(err.strip().splitlines()) == 1
        assert "dlq.db.1" in err
        assert "Traceback" not in out + err
    code, out, _ = run(capsys, "dlq", "list", "--path", str(path), "--json")
    assert code == 2
    assert [entry["slot"] for entry in json.loads(out)["entries"]] == [0, 0]
    code, out, err = run(
        capsys, "dlq", "replay", "--path", str(path), "--store", "tests.deadletter.factories:memory_store"
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"slot 0 ({path}): 2 of 2 replayed" in out
    assert "totals unknown, 1 file(s) could not be read" in out
    assert "remaining" not in out
    assert pending(path) == 0
    assert damaged.read_bytes() == before  # left for inspection, untouched


def test_replay_chooses_a_target_when_the_files_record_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dlq.db"
    prepare_slots(path, ("db-a", "db-b"))
    argv = ("dlq", "replay", "--path", str(path), "--store", "tests.deadletter.factories:memory_store")
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "db-a, db-b" in err
    assert "--target" in err
    code, _, err = run(capsys, *argv, "--target", "db-b")
    assert code == 2, "db-b is not the identity of the store the factory builds"
    assert "--retarget 'db-b'" in err
    code, out, _ = run(capsys, *argv, "--retarget", "db-b", "--json")
    document = json.loads(out)
    assert (code, document["replayed"]) == (0, 2)
    assert [file["path"] for file in document["files"]] == [f"{path}.1"]
    assert pending(path) == 2
    assert pending(Path(f"{path}.1")) == 0
