"""The whole contract suite through PgBouncer in transaction mode (``pooler="transaction"``)."""

from __future__ import annotations

from guarded.testing import StateStoreContract


class TestPostgresStoreThroughPgBouncer(StateStoreContract):
    """Every contract of :mod:`guarded.testing.contract`; ``store`` comes through the pooler."""
