"""Hostile snapshot directories: a real snapshot saved by a ``FileSnapshotStore``, then changed as an
attacker who hands over the whole directory would (the manifest forged to match when that helps),
and the tools to check that nothing else changed.

A restore of a hostile snapshot runs in a child process (``python -m tests.snapshots._hostile``)
under a hard address-space limit; it reports the error it met, whether the target store is unchanged,
and its peak RSS.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from guarded.snapshots.content import content_hash

ADDRESS_SPACE = 1536 << 20
"""The child's hard address-space limit (Python and its libraries need some)."""
PEAK_RSS = 200 << 20
"""The bound every hostile restore must stay under."""
CHILD_TIMEOUT = 120.0
"""A child still running after this long hung (a FIFO read, a bomb decompressed without end)."""


async def build_snapshot(store_dir: Path, *, seed: int = 1) -> tuple[str, list[str]]:
    """Capture a random session ``s1`` into a file store in ``store_dir``; its id and traces."""
    from guarded.backends.memory import InMemoryStateStore
    from guarded.codec import penguiflow_types
    from guarded.snapshots import FileSnapshotStore, capture

    from ._sessions import populate

    source = InMemoryStateStore(record_types=penguiflow_types())
    traces = await populate(source, random.Random(seed), "s1", events=60)
    async with await capture(source, session_id="s1", memory_keys=["custom:s1"]) as captured:
        record = await FileSnapshotStore(store_dir).save(captured)
    return record.id, traces


def section_file(store_dir: Path, snapshot_id: str, section: str) -> Path:
    return store_dir / "snapshots" / snapshot_id / "sections" / f"{section}.jsonl.gz"


def manifest_file(store_dir: Path, snapshot_id: str) -> Path:
    return store_dir / "snapshots" / snapshot_id / "manifest.json"


def read_lines(store_dir: Path, snapshot_id: str, section: str) -> list[bytes]:
    with gzip.open(section_file(store_dir, snapshot_id, section), "rb") as handle:
        return [line.rstrip(b"\n") for line in handle]


def forge_manifest(
    store_dir: Path, snapshot_id: str, section: str, *, count: int, size: int, digest: str
) -> None:
    """Make the manifest agree with a section the attacker wrote (counts, sizes, hashes)."""
    path = manifest_file(store_dir, snapshot_id)
    manifest = json.loads(path.read_bytes())
    manifest["counts"][section] = count
    manifest["sizes"][section] = size
    manifest["section_hashes"][section] = digest
    manifest["content_hash"] = content_hash(manifest["section_hashes"])
    path.write_text(json.dumps(manifest))


def write_section(
    store_dir: Path, snapshot_id: str, section: str, lines: Iterable[bytes], *, forge: bool = True
) -> None:
    """Replace a section's file with ``lines``; with ``forge``, the manifest is made to match."""
    digest = hashlib.sha256()
    count = size = 0
    with gzip.open(section_file(store_dir, snapshot_id, section), "wb") as handle:
        for line in lines:
            handle.write(line + b"\n")
            digest.update(line + b"\n")
            count += 1
            size += len(line)
    if forge:
        forge_manifest(store_dir, snapshot_id, section, count=count, size=size, digest=digest.hexdigest())


def write_bomb(path: Path, chunks: Iterator[bytes]) -> tuple[int, int, str]:
    """A gzip file of ``chunks`` compressed hard; its (newlines, uncompressed bytes, SHA-256)."""
    digest = hashlib.sha256()
    newlines = size = 0
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    with path.open("wb") as handle:
        for chunk in chunks:
            digest.update(chunk)
            newlines += chunk.count(b"\n")
            size += len(chunk)
            handle.write(compressor.compress(chunk))
        handle.write(compressor.flush())
    return newlines, size, digest.hexdigest()


def tree(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under ``root`` (symbolic links not followed): kind, size and mtime."""
    found: dict[str, tuple[str, int, int]] = {}
    for directory, names, files in os.walk(root, followlinks=False):
        for name in [*names, *files]:
            path = os.path.join(directory, name)
            stat = os.lstat(path)
            kind = "link" if os.path.islink(path) else "dir" if os.path.isdir(path) else "file"
            found[os.path.relpath(path, root)] = (kind, stat.st_size, stat.st_mtime_ns)
    return found


def fill_outside(outside: Path) -> None:
    """Files an attacker would like to read, touch or delete."""
    (outside / "sub").mkdir(parents=True)
    for index in range(5):
        (outside / f"secret-{index}").write_bytes(os.urandom(100))
    (outside / "sub" / "nested").write_bytes(b"nested")


def restore_in_child(store_dir: Path, snapshot_id: str, traces: list[str]) -> dict[str, Any]:
    """Load and restore in a child process under :data:`ADDRESS_SPACE`; what the child reports."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.snapshots._hostile", str(store_dir), snapshot_id, json.dumps(traces)],
        capture_output=True,
        timeout=CHILD_TIMEOUT,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return report


async def _child(store_dir: Path, snapshot_id: str, traces: list[str]) -> dict[str, Any]:
    from guarded.backends.memory import InMemoryStateStore
    from guarded.codec import penguiflow_types
    from guarded.snapshots import FileSnapshotStore, restore

    from ._sessions import observe

    target = InMemoryStateStore(record_types=penguiflow_types())
    before = await observe(target, "s1", traces)
    error: BaseException | None = None
    try:
        async with await FileSnapshotStore(store_dir).load(snapshot_id) as content:
            await restore(content, target)
    except Exception as exc:
        error = exc
    after = await observe(target, "s1", traces)
    return {
        "error": None if error is None else type(error).__name__,
        "snapshot_error": error is not None and _is_snapshot_error(error),
        "message": "" if error is None else str(error)[:2000],
        "unchanged": before == after,
        "peak_rss": _peak_rss(),
    }


def _peak_rss() -> int:
    """This process's peak resident set in bytes: ``VmHWM``, the high-water mark of its own
    address space. ``ru_maxrss`` is no measure here: Linux carries it over from the parent through
    fork and exec, so a child of a large test process would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _is_snapshot_error(error: BaseException) -> bool:
    from guarded.snapshots import SnapshotError

    return isinstance(error, SnapshotError)


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    store_dir, snapshot_id, traces = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    print(json.dumps(asyncio.run(_child(Path(store_dir), snapshot_id, traces))))


if __name__ == "__main__":
    main()
