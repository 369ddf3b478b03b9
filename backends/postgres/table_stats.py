"""Row counts and on-disk sizes of a store's tables, for the metrics and ``guarded pg status``.

Rows are PostgreSQL's live-tuple estimate (``pg_stat_user_tables.n_live_tup``, falling back to
``pg_class.reltuples``): exact counts would scan the tables. Sizes are
``pg_total_relation_size`` (heap, indexes and TOAST). A partitioned table counts the rows and
bytes of all its partitions.
"""

from __future__ import annotations

from .connection import Database
from .schema_names import TABLES

_SQL = """
SELECT c.relname AS table_name,
       sum(COALESCE(s.n_live_tup, GREATEST(p.reltuples, 0)))::bigint AS row_estimate,
       sum(pg_total_relation_size(p.oid))::bigint AS total_bytes
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL (
    SELECT c.oid AS relid WHERE c.relkind = 'r'
    UNION ALL SELECT relid FROM pg_catalog.pg_partition_tree(c.oid) WHERE c.relkind = 'p'
) t
JOIN pg_catalog.pg_class p ON p.oid = t.relid AND p.relkind = 'r'
LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = p.oid
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname = ANY($2::text[])
GROUP BY c.relname
"""


async def table_stats(db: Database, schema: str) -> dict[str, tuple[int, int]]:
    """``{table: (estimated rows, total bytes)}`` for every data table of ``schema``."""
    records = await db.fetch(_SQL, schema, list(TABLES))
    return {
        record["table_name"]: (int(record["row_estimate"]), int(record["total_bytes"])) for record in records
    }


__all__ = ["table_stats"]
