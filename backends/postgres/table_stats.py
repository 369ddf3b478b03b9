"""Row counts and on-disk sizes of a store's tables, for the metrics and ``guarded pg status``.

Rows are PostgreSQL's live-tuple estimate (``pg_stat_user_tables.n_live_tup``, falling back to
``pg_class.reltuples``): exact counts would scan the tables. Sizes are
``pg_total_relation_size`` (heap, indexes and TOAST).
"""

from __future__ import annotations

from .connection import Database
from .schema_names import TABLES

_SQL = """
SELECT c.relname AS table_name,
       COALESCE(s.n_live_tup, GREATEST(c.reltuples, 0))::bigint AS row_estimate,
       pg_total_relation_size(c.oid) AS total_bytes
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname = ANY($2::text[])
"""


async def table_stats(db: Database, schema: str) -> dict[str, tuple[int, int]]:
    """``{table: (estimated rows, total bytes)}`` for every data table of ``schema``."""
    records = await db.fetch(_SQL, schema, list(TABLES))
    return {
        record["table_name"]: (int(record["row_estimate"]), int(record["total_bytes"])) for record in records
    }


__all__ = ["table_stats"]
