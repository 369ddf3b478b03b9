"""A real ``redis-server`` for tests: one process on a free loopback port, in a temporary directory.

::

    with RedisServer.started() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        ...
        server.kill()       # SIGKILL: nothing acknowledged is lost (appendfsync always)
        server.restart()    # the same port and data directory
        server.pause()      # SIGSTOP: connections hang, as on a stalled host
        server.resume()     # SIGCONT

The server runs with ``appendonly yes`` and ``appendfsync always``: every write it acknowledged
is in the append-only file before the reply, so a ``kill -9`` followed by :meth:`RedisServer.restart`
loses nothing acknowledged. The binary is Debian's ``redis-server`` (``scripts/ensure-apt-tools.sh``
installs it); ``GUARDED_REDIS_SERVER`` names another.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

SERVER_ENV = "GUARDED_REDIS_SERVER"
"""Environment variable naming the ``redis-server`` binary (default: the one on ``PATH``)."""

START_TIMEOUT = 30.0
"""Seconds a starting server has to answer ``PING`` (generous: a loaded 2-core machine)."""


class RedisServerError(RuntimeError):
    """The server could not be started (no binary, or it did not come up in time)."""


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_binary() -> str:
    """The ``redis-server`` to run; :class:`RedisServerError` when there is none."""
    named = os.environ.get(SERVER_ENV)
    found = (
        named
        or shutil.which("redis-server")
        or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    )
    if not found:
        raise RedisServerError(
            "redis-server not found: run scripts/ensure-apt-tools.sh (or set GUARDED_REDIS_SERVER)"
        )
    return found


def _ping(port: int, timeout: float = 1.0) -> bytes | None:
    """The server's answer to an inline ``PING`` (``b"+PONG"``, or an error such as ``-LOADING``),
    or ``None`` when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(128).strip()
    except OSError:
        return None


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1``; see the module docs."""

    def __init__(
        self, *, port: int | None = None, directory: str | Path | None = None, extra: Sequence[str] = ()
    ) -> None:
        """A server not started yet (:meth:`start`): ``port`` (default a free one), ``directory``
        for its data (default a new temporary directory, removed by :meth:`stop`), ``extra``
        ``redis-server`` arguments (``["--maxmemory", "10mb"]``)."""
        self.port = port or free_port()
        self._owns_directory = directory is None
        self.directory = (
            Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="guarded-redis-"))
        )
        self.extra = tuple(extra)
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextlib.contextmanager
    def started(cls, **options: object) -> Iterator[Self]:
        """A started server, stopped (and its directory removed) on exit."""
        server = cls(**options)  # type: ignore[arg-type]
        server.start()
        try:
            yield server
        finally:
            server.stop()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The process id while the server runs."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _arguments(self) -> list[str]:
        return [
            server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
            *self.extra,
        ]

    def start(self, *, wait: bool = True) -> None:
        """Start the server and wait until it answers ``PING`` (``wait=False``: return once the
        process runs, while it may still be loading its data set)."""
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            self._arguments(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the server answers ``PING`` with ``PONG`` (not ``LOADING``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with {self._process.returncode}: {self._log_tail()}"
                )
            if _ping(self.port) == b"+PONG":
                return
            time.sleep(0.02)
        raise RedisServerError(f"redis-server did not answer PING within {timeout} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        log = self.directory / "redis.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the server and reap it (the data directory stays for :meth:`restart`)."""
        if self._process is None:
            return
        self._signal(signal.SIGCONT)  # a paused process is killed all the same; resume it first
        self._signal(signal.SIGKILL)
        self._process.wait(timeout=30)
        self._process = None

    def shutdown(self) -> None:
        """Stop the server with SIGTERM (a clean shutdown) and reap it; the data stays."""
        if self._process is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=30)
        self._process = None

    def restart(self, *, wait: bool = True) -> None:
        """Start again on the same port and data directory (after :meth:`kill` or :meth:`shutdown`;
        a running server is killed first); ``wait`` as in :meth:`start`."""
        if self.running:
            self.kill()
        self._process = None
        self.start(wait=wait)

    def pause(self) -> None:
        """SIGSTOP the server: it takes connections into the kernel's backlog and answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill the server and remove the data directory when this object made it."""
        self.kill()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["RedisServer", "RedisServerError", "SERVER_ENV", "START_TIMEOUT", "free_port", "server_binary"]
