"""The PostgreSQL backend's part of the ``guarded`` command line (:data:`COMMAND_LINE`): its
``guarded pg`` command (:mod:`.cli`), and what the commands that work with any store ask of it:
which errors mean the server could not be reached, what a schema not migrated means, which server
:mod:`.factory` tried, and the scratch schema ``guarded check`` runs the contracts in.
"""

from __future__ import annotations

import contextlib

from guarded.cli.plugin import (
    BackendCommandLine,
    CommandError,
    NotMigratedError,
    ProblemError,
    ScratchPlace,
    Subparsers,
    TargetTried,
    UsageError,
)

from . import cli
from .cli_target import is_unreachable, resolve_target
from .factory import config_from_env
from .partitioning import PartitioningError
from .schema_migrations import SchemaNotMigratedError, SchemaTooNewError
from .schema_names import quote_ident
from .store import PostgresStateStore

FACTORY_MODULE = "guarded.backends.postgres.factory"
"""The module of the backend's own factory, as ``guarded check`` names it (``MODULE:create_store``)."""


class PostgresCommandLine(BackendCommandLine):
    """``guarded pg``, and the PostgreSQL store as the other commands see it."""

    def register(self, subparsers: Subparsers) -> None:
        cli.register(subparsers)

    def is_unreachable(self, error: BaseException) -> bool:
        return is_unreachable(error)

    def command_error(self, error: BaseException) -> CommandError | None:
        if isinstance(error, SchemaNotMigratedError):
            return NotMigratedError(str(error), "run 'guarded pg migrate' for the store's schema")
        if isinstance(error, SchemaTooNewError):
            return ProblemError(str(error), "upgrade guarded")
        if isinstance(error, PartitioningError):
            return ProblemError(str(error), "run 'guarded pg partition' for the store's schema")
        return None

    def factory_target(self, factory_module: str) -> TargetTried | None:
        if factory_module != FACTORY_MODULE:
            return None
        with contextlib.suppress(Exception):
            config = config_from_env()
            found = resolve_target(None, config.schema, config.dsn)
            return TargetTried(
                found.describe(),
                found.identity,
                "set GUARDED_PG_DSN (or DATABASE_URL, or PGHOST and friends) and check that the server is up",
            )
        return None

    def scratch_variables(self, namespace: str) -> dict[str, str]:
        """The scratch schema, migrations on (it is new) and no table sampling."""
        return {
            "GUARDED_PG_SCHEMA": namespace,
            "GUARDED_PG_MIGRATE": "1",
            "GUARDED_PG_STATS_INTERVAL": "none",
        }

    def scratch_place(self, store: object, namespace: str, factory: str) -> ScratchPlace | None:
        if not isinstance(store, PostgresStateStore):
            return None
        if store.schema != namespace:
            raise UsageError(
                f"the store from {factory!r} uses schema {store.schema!r}, not the scratch schema "
                f"{namespace} guarded check asked for, and the contracts would write into it",
                f"make the factory read GUARDED_PG_SCHEMA, as {FACTORY_MODULE}:create_store does",
            )
        server = store.target_identity.split("?", 1)[0]
        return ScratchPlace(
            "postgresql_schema",
            f"PostgreSQL schema {namespace} in {server}",
            target=server,
            drop_by_hand=f'DROP SCHEMA "{namespace}" CASCADE',
        )

    async def drop_scratch(self, store: object, namespace: str) -> None:
        if not isinstance(store, PostgresStateStore):
            return
        try:
            pool = store.pool
        except RuntimeError:  # a lazy store that never connected: nothing was created
            return
        async with pool.acquire() as conn:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")


COMMAND_LINE = PostgresCommandLine()
"""The backend's command line, listed in :data:`guarded.cli.plugin.BUILT_IN`."""

__all__ = ["COMMAND_LINE", "FACTORY_MODULE", "PostgresCommandLine"]
