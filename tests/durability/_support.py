"""What the durability tests do to processes: start and kill guarded workers, stall the server.

* :class:`Worker` runs ``python -m tests.durability._worker ...`` and reads, on a thread, the
  acknowledgements it prints (so its pipe never fills), for :meth:`Worker.ledgers`.
* :class:`Stall` freezes the whole PostgreSQL server (SIGSTOP of the postmaster and every child)
  and thaws it (SIGCONT); :func:`thaw` thaws whatever is frozen, for fixtures' teardown.
* :func:`pending_on_disk` counts the writes waiting in the spill files under a directory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from guarded.deadletter import SpillFile, SpillFileError
from guarded.testing.postgres import EmbeddedPostgres
from tests.support.aio import eventually as _eventually

from ._worker import MixedLedger, ledger_of

REPO = Path(__file__).resolve().parents[2]

eventually = functools.partial(_eventually, within=60.0, poll=0.01)
"""Processes and a database server are slow to move: a minute, polled every 10 ms."""


def worker_env(state_home: Path) -> dict[str, str]:
    """The environment of a worker: this one, with ``XDG_STATE_HOME`` at ``state_home`` (so the
    default spill path is under the test's directory) and no ``GUARDED_DLQ_PATH``."""
    env = {name: value for name, value in os.environ.items() if name != "GUARDED_DLQ_PATH"}
    env["XDG_STATE_HOME"] = str(state_home)
    return env


class Worker:
    """One ``tests.durability._worker`` process; stderr goes to ``log`` (a file: never blocks)."""

    def __init__(self, arguments: list[str], *, state_home: Path, log: Path) -> None:
        self.log = log
        self.acks: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.marks: list[str] = []
        """Other lines: ``H``, ``S``, ``C <left over>``, ``done``."""
        self._writers: set[int] = set()
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.durability._worker", *arguments],
                cwd=REPO,
                env=worker_env(state_home),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "A":
                writer, index = rest.split()
                self.acks.append((int(writer), int(index)))
            elif kind == "E":
                self.errors.append(rest)
            else:
                self.marks.append(line.strip())

    @property
    def acked(self) -> int:
        return len(self.acks)

    def acked_by(self, writer: int) -> int:
        return sum(1 for number, _ in self.acks if number == writer)

    def has(self, mark: str) -> bool:
        return any(line == mark or line.startswith(mark + " ") for line in self.marks)

    def exited(self) -> bool:
        return self.process.poll() is not None

    def kill(self) -> None:
        """SIGKILL (when still running), then wait for the process and its last printed lines."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        self._reader.join(timeout=30)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return code

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def in_flight(self, writers: range) -> list[tuple[int, int]]:
        """The write each of ``writers`` may have had in flight when the process was killed: the
        one after its last acknowledged write (a writer waits for each write before the next)."""
        assert self.process.poll() is not None, "ask a finished process"
        last: dict[int, int] = {}
        for writer, index in self.acks:
            last[writer] = index
        return [(writer, last.get(writer, -1) + 1) for writer in writers]

    def ledgers(self, writers: range) -> tuple[MixedLedger, MixedLedger]:
        """``(acknowledged, acknowledged plus in flight)`` of a killed process (see
        :func:`~._worker.landed_differences`)."""
        return ledger_of(self.acks), ledger_of([*self.acks, *self.in_flight(writers)])


def postmaster_pid(server: EmbeddedPostgres) -> int | None:
    try:
        return int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (read from /proc/*/stat: /proc/PID/task/*/children is not
    available on every kernel)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(name))
    return found


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


class Stall:
    """The server stalled: every PostgreSQL process stopped (SIGSTOP), connections and statements
    hang without an error, as with a frozen VM or a stuck disk. Always :meth:`resume` (in a
    ``finally``): a stalled server hangs every later test."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self.stopped: list[int] = []

    def stop(self) -> None:
        postmaster = postmaster_pid(self.server)
        assert postmaster is not None, "the server is not running"
        _signal([postmaster], signal.SIGSTOP)  # first: a stopped postmaster forks no new backend
        self.stopped.append(postmaster)
        while True:
            new = [pid for pid in children(postmaster) if pid not in self.stopped]
            if not new:
                return
            _signal(new, signal.SIGSTOP)
            self.stopped.extend(new)

    def resume(self) -> None:
        _signal(list(reversed(self.stopped)), signal.SIGCONT)
        self.stopped.clear()


def thaw(server: EmbeddedPostgres) -> None:
    """SIGCONT the postmaster and all its children, whatever stopped them."""
    postmaster = postmaster_pid(server)
    if postmaster is not None:
        _signal([*children(postmaster), postmaster], signal.SIGCONT)


def pending_on_disk(directory: Path) -> int:
    """Writes waiting in every dead-letter spill file under ``directory`` (any name, so slot files
    count whatever they are called); files that are not spill files are ignored."""
    waiting = 0
    for path in directory.rglob("*"):
        try:
            with path.open("rb") as file:
                if file.read(16) != b"SQLite format 3\x00":
                    continue
        except OSError:
            continue
        try:
            spill = SpillFile.open_read_only(str(path))
        except SpillFileError:
            continue
        try:
            waiting += spill.totals().pending
        finally:
            spill.close()
    return waiting
