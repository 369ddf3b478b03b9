"""Which database a command tries, said in its errors: the DSN's source and asyncpg's defaults.

``guarded pg`` takes ``--dsn``, else ``GUARDED_PG_DSN``, else ``DATABASE_URL``, else asyncpg's
``PG*`` variables and defaults. When the database cannot be reached, the error names the target
(without its password) and where it came from, so "connection refused" never leaves the
operator guessing which server was tried.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

from guarded.cli.plugin import CommandError, UnreachableError, UsageError

from .target import target_identity

DEFAULT_SOCKET_DIRECTORIES = ("/run/postgresql", "/var/run/postgresql", "/tmp")
"""Where asyncpg looks for a Unix socket when neither a DSN nor ``PGHOST`` names a host."""

_UNREACHABLE_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
        errno.EADDRNOTAVAIL,
        errno.ENOENT,  # a Unix socket that is not there
    }
)
_REFUSED_BY_SERVER = ("08", "28", "3D000", "57P03", "53300")
"""SQLSTATEs of a server that answered but would not take the connection: connection exceptions,
invalid authorisation, no such database, cannot connect now (starting up, shutting down), too
many connections."""


@dataclass(frozen=True, slots=True)
class Target:
    """The DSN a command uses and how to name it in messages."""

    dsn: str | None
    schema: str
    source: str
    """``--dsn``, ``GUARDED_PG_DSN``, ``DATABASE_URL``, ``the PG* variables`` or ``the default``."""
    environ: Mapping[str, str]

    @property
    def identity(self) -> str:
        """``postgresql://HOST:PORT/DATABASE?schema=SCHEMA``, never a password."""
        return target_identity(self.dsn, self.schema, self.environ)

    def describe(self) -> str:
        """The target and where it came from, e.g. ``postgresql://localhost:5432/app?schema=public
        (the default: no --dsn, GUARDED_PG_DSN, DATABASE_URL or PGHOST; asyncpg also tried the Unix
        sockets in /run/postgresql, /var/run/postgresql and /tmp)``."""
        if self.source != "the default":
            return f"{self.identity} (from {self.source})"
        sockets = ", ".join(DEFAULT_SOCKET_DIRECTORIES[:-1]) + f" and {DEFAULT_SOCKET_DIRECTORIES[-1]}"
        return (
            f"{self.identity} (the default: none of --dsn, GUARDED_PG_DSN, DATABASE_URL or PGHOST is set; "
            f"asyncpg also tried the Unix sockets in {sockets})"
        )


def resolve_target(
    dsn_option: str | None, schema: str, config_dsn: str | None, environ: Mapping[str, str] | None = None
) -> Target:
    """The target for ``--dsn`` (``dsn_option``) or the factory configuration's DSN, with its source."""
    env = os.environ if environ is None else environ
    if dsn_option:
        return Target(dsn_option, schema, "--dsn", env)
    if config_dsn:
        guarded_dsn = (env.get("GUARDED_PG_DSN") or "").strip()
        source = "GUARDED_PG_DSN" if guarded_dsn and guarded_dsn == config_dsn.strip() else "DATABASE_URL"
        return Target(config_dsn, schema, source, env)
    given = [name for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER") if env.get(name)]
    if "PGHOST" in given:
        return Target(None, schema, "the PG* variables: " + ", ".join(given), env)
    return Target(None, schema, "the default", env)


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or would not take a connection."""
    if isinstance(exc, (asyncpg.ClientConfigurationError, asyncpg.InterfaceError)) and not isinstance(
        exc, asyncpg.ConnectionDoesNotExistError
    ):
        return False
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError, socket.gaierror, EOFError)):
        return True
    if isinstance(exc, asyncpg.ConnectionDoesNotExistError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        code = getattr(exc, "sqlstate", None) or ""
        return code.startswith(_REFUSED_BY_SERVER)
    if isinstance(exc, OSError):
        return exc.errno in _UNREACHABLE_ERRNOS or str(exc).startswith("Multiple exceptions")
    return False


def connect_failure(exc: BaseException, target: Target, *, doing: str = "connect to") -> CommandError:
    """The :class:`~guarded.cli.plugin.CommandError` for a failed connection to ``target``."""
    if isinstance(exc, (asyncpg.ClientConfigurationError, ValueError, OverflowError)) and not is_unreachable(
        exc
    ):
        return UsageError(
            f"invalid connection string (from {target.source}): {exc}",
            "write it as postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
        )
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, asyncpg.PostgresError):
        hint = "check the user, password and database name"
        if (getattr(exc, "sqlstate", None) or "").startswith(("57P03", "53300")):
            hint = "the server is starting, stopping or full; try again shortly"
    elif target.source == "the default":
        hint = "pass --dsn or set GUARDED_PG_DSN (or DATABASE_URL, or PGHOST and friends)"
    else:
        hint = "check that the server is up and the host and port are right"
    return UnreachableError(
        f"cannot {doing} PostgreSQL at {target.describe()}: {why}", hint, target=target.identity
    )


__all__ = ["DEFAULT_SOCKET_DIRECTORIES", "Target", "connect_failure", "is_unreachable", "resolve_target"]
