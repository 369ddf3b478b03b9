"""A throwaway real PgBouncer in front of a test PostgreSQL server, for tests and benchmarks.

:class:`PgBouncer` writes a configuration into a fresh temporary directory, starts the system's
``pgbouncer`` binary (Debian's package; ``make tools`` installs it) on a free loopback port in
front of a server (an :class:`~guarded.testing.postgres.EmbeddedPostgres`, or any host and port
accepting the ``postgres`` user without a password) and gives a DSN that reaches the server
through it::

    with embedded_postgres() as server, pgbouncer(server) as bouncer:
        store = await PostgresStateStore.connect(bouncer.dsn, pooler="transaction")

The pooler keeps PgBouncer's defaults where they matter to a client -- ``pool_mode`` is
``transaction`` and ``ignore_startup_parameters`` is empty, so a start-up parameter other than
the few PgBouncer tracks itself is refused, as in a stock installation. PgBouncer refuses to run
as root: when the current process is root it runs as the same unprivileged system user as the
embedded server.
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .postgres import DEFAULT_SYSTEM_USER, EmbeddedPostgres, ensure_system_user, free_port


class PgBouncerError(RuntimeError):
    """PgBouncer is missing, or could not be started or stopped."""


def pgbouncer_binary() -> str:
    """The path of the ``pgbouncer`` binary, or a :class:`PgBouncerError` saying how to get it."""
    found = shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(path, os.X_OK)), None
    )
    if found is None:
        raise PgBouncerError(
            "pgbouncer is not installed: run `make tools` (as root it installs the Debian package "
            "'pgbouncer'), or `apt-get install pgbouncer`, or put a pgbouncer binary on PATH"
        )
    return found


class PgBouncer:
    """One PgBouncer process on ``127.0.0.1`` in front of ``server_host:server_port``."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 10,
        settings: Mapping[str, str] | None = None,
        system_user: str = DEFAULT_SYSTEM_USER,
        start_timeout: float = 30.0,
    ) -> None:
        self.server_host = server_host
        self.server_port = server_port
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        self.user = "postgres"
        self.database = "postgres"
        self.base_dir = Path(tempfile.mkdtemp(prefix="guarded-pgbouncer-"))
        self.config_file = self.base_dir / "pgbouncer.ini"
        self.log_file = self.base_dir / "pgbouncer.log"
        self.start_timeout = start_timeout
        self.settings = {
            "listen_addr": self.host,
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.base_dir / "userlist.txt"),
            "pool_mode": pool_mode,
            "default_pool_size": str(pool_size),
            "max_client_conn": "500",
            "logfile": str(self.log_file),
            "admin_users": self.user,
            **(settings or {}),
        }
        self._binary = pgbouncer_binary()
        self._ids: tuple[int, int] | None = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._ids = ensure_system_user(system_user)
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def in_front_of(cls, server: EmbeddedPostgres, **options: Any) -> PgBouncer:
        """A pooler for an embedded server (not started)."""
        return cls(server.host, server.port, **options)

    def _write_config(self) -> None:
        lines = ["[databases]", f"* = host={self.server_host} port={self.server_port}", "", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in self.settings.items()]
        self.config_file.write_text("\n".join(lines) + "\n")
        (self.base_dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        if self._ids is not None:
            for path in (self.base_dir, self.config_file, self.base_dir / "userlist.txt"):
                os.chown(path, *self._ids)

    def start(self) -> str:
        """Start PgBouncer and return the DSN that reaches the server through it."""
        if self._process is not None and self._process.poll() is None:
            return self.dsn
        self._write_config()
        kwargs: dict[str, Any] = {}
        if self._ids is not None:
            kwargs.update(user=self._ids[0], group=self._ids[1], extra_groups=[])
        self._process = subprocess.Popen(
            [self._binary, str(self.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=str(self.base_dir),
            **kwargs,
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                code = self._process.returncode
                raise PgBouncerError(f"pgbouncer exited with code {code}\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return self.dsn
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise PgBouncerError(
                        f"pgbouncer did not listen on {self.host}:{self.port}\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM, then SIGKILL after 10 s; a stalled one is resumed first to take
        it); its clients lose their connections."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def restart(self) -> None:
        """Stop and start again on the same port."""
        self.stop()
        self.start()

    def stall(self) -> None:
        """Freeze PgBouncer (SIGSTOP): it still accepts connections (the kernel completes them) but
        answers nothing, as a pooler stuck on a frozen VM or a full queue. Always :meth:`resume`."""
        os.kill(self._running().pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a stalled PgBouncer run again (SIGCONT)."""
        os.kill(self._running().pid, signal.SIGCONT)

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            raise PgBouncerError("pgbouncer is not running")
        return self._process

    def destroy(self) -> None:
        """Stop PgBouncer and delete its directory."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of PgBouncer's log (for error messages)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "pgbouncer log:\n" + "\n".join(text.splitlines()[-lines:])

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` through the pooler."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


@contextlib.contextmanager
def pgbouncer(server: EmbeddedPostgres, **options: Any) -> Iterator[PgBouncer]:
    """Start PgBouncer in front of ``server``, yield it (``bouncer.dsn``), then stop it."""
    bouncer = PgBouncer.in_front_of(server, **options)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.destroy()


__all__ = ["PgBouncer", "PgBouncerError", "pgbouncer", "pgbouncer_binary"]
