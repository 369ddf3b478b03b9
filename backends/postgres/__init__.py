"""PostgreSQL backend on asyncpg: ``from guarded.backends.postgres import PostgresStateStore``.

See ``backends/postgres/README.md`` for configuration, migrations, tenancy, retention and the
command line (``guarded pg migrate|status|cleanup``).
"""

from .artifact_store import ArtifactLimitError, ArtifactTooLargeError, PostgresArtifactStore
from .connection import PoolSettings
from .error_classifier import POSTGRES_ERRORS, PostgresErrors  # first: registers the error classifier
from .options import RetentionPolicy
from .retention import CleanupReport
from .schema_migrations import MigrationError, MigrationStatus, SchemaNotMigratedError, SchemaTooNewError
from .schema_names import InvalidSchemaNameError, validate_schema_name
from .snapshots import PostgresSnapshotStore
from .store import PostgresStateStore, StoreOptions

__all__ = [
    "ArtifactLimitError",
    "ArtifactTooLargeError",
    "CleanupReport",
    "InvalidSchemaNameError",
    "MigrationError",
    "MigrationStatus",
    "POSTGRES_ERRORS",
    "PoolSettings",
    "PostgresArtifactStore",
    "PostgresErrors",
    "PostgresSnapshotStore",
    "PostgresStateStore",
    "RetentionPolicy",
    "SchemaNotMigratedError",
    "SchemaTooNewError",
    "StoreOptions",
    "validate_schema_name",
]
