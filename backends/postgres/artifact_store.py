"""An :class:`~guarded.models.ArtifactStore` on ``bytea`` honouring ``ArtifactRetentionConfig``.

Same rules as the in-memory reference (:class:`guarded.backend.InMemoryArtifactStore`):

* IDs are content-addressed like PenguiFlow's (``{namespace or 'art'}_{sha256[:12]}``); putting
  the same content under the same namespace returns the stored ref and refreshes its TTL.
* ``ttl_seconds``: an artifact older than this is invisible to every method (``<= 0``: never
  expires); ``cleanup()`` deletes expired rows.
* ``max_artifact_bytes``: a larger artifact is refused (:class:`ArtifactTooLargeError`) before I/O.
* ``max_session_bytes`` / ``max_artifacts_per_session`` per ``scope.session_id`` and
  ``max_trace_bytes`` / ``max_artifacts_per_trace`` per ``scope.trace_id`` (artifacts without
  one form a group of their own). When a put would exceed a limit, ``cleanup_strategy``
  ``"lru"`` evicts the group's least recently used artifacts (``get`` and ``put`` count as use),
  ``"fifo"`` the oldest inserted, and ``"none"`` refuses the put (:class:`ArtifactLimitError`).

A put runs in one transaction holding advisory locks on its session and trace groups, so
concurrent puts -- from any number of processes -- cannot overshoot a limit. Use order is a
sequence value, not a timestamp, so LRU is exact.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

from guarded.backend import (
    ArtifactLimitError,
    ArtifactPut,
    ArtifactTooLargeError,
    CheckedArtifactPuts,
    GroupLimit,
    plan_evictions,
)
from guarded.codec import ARTIFACT_REF, ARTIFACT_SCOPE, RecordTypes
from guarded.errors import InvalidPayloadError
from guarded.models import ArtifactRetentionConfig

from .connection import Connection, Database, transaction
from .json_codec import (
    check_text,
    dump_json,
    loads_json,
    refusing,
    to_db_text,
    to_db_text_opt,
)
from .schema_names import next_seq, qualified

_LIVE = "(expires_at IS NULL OR expires_at > now())"


@dataclass(frozen=True, slots=True)
class _Member:
    artifact_id: str
    size: int
    order: int
    session_key: str | None
    trace_key: str | None


def _key_in(group: GroupLimit, member: _Member) -> str | None:
    """The key of ``member`` in ``group``'s kind of group (its session or its trace)."""
    return member.session_key if group.group == "session" else member.trace_key


def plan_member_evictions(
    members: list[_Member], groups: tuple[GroupLimit, ...], size: int, strategy: str
) -> list[str]:
    """IDs to evict (oldest first by the strategy's order) so ``size`` more bytes fit every group."""
    ordered = sorted(members, key=lambda member: member.order)
    return plan_evictions(
        groups,
        lambda group: [
            (member.artifact_id, member.size) for member in ordered if _key_in(group, member) == group.key
        ],
        size,
        strategy,
    )


class PostgresArtifactStore(CheckedArtifactPuts[tuple[tuple[Any, ...], tuple[GroupLimit, GroupLimit]]]):
    """Artifacts in the ``artifacts`` table of a store's schema (``store.artifact_store``)."""

    def __init__(
        self,
        db: Database,
        schema: str,
        retention: ArtifactRetentionConfig | None = None,
        types: RecordTypes | None = None,
    ) -> None:
        from guarded.codec import DEFAULT_TYPES

        self._db = db
        self._schema = schema
        self._retention = retention or ArtifactRetentionConfig()
        self._types = types or DEFAULT_TYPES
        table = self._table = qualified(schema, "artifacts")
        seq = next_seq(schema)
        ttl = self._retention.ttl_seconds
        self._expires = f"now() + make_interval(secs => {int(ttl)})" if ttl > 0 else "NULL"
        self._refresh = (
            f"UPDATE {table} SET created_at = now(), expires_at = {self._expires}, used_seq = {seq} "
            f"WHERE artifact_id = $1 AND {_LIVE} RETURNING ref"
        )
        self._insert = (
            f"INSERT INTO {table} (artifact_id, session_key, trace_key, size_bytes, mime_type, sha256, ref, "
            "data, inserted_seq, used_seq, expires_at) "
            f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {seq}, {seq}, {self._expires}) "
            "ON CONFLICT (artifact_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at, "
            "used_seq = EXCLUDED.used_seq RETURNING ref"
        )
        self._get_touch = (
            f"UPDATE {table} SET used_seq = {seq} WHERE artifact_id = $1 AND {_LIVE} RETURNING data"
        )
        self._get = f"SELECT data FROM {table} WHERE artifact_id = $1 AND {_LIVE}"
        self._get_ref = f"SELECT ref FROM {table} WHERE artifact_id = $1 AND {_LIVE}"
        self._delete = f"DELETE FROM {table} WHERE artifact_id = $1 RETURNING {_LIVE}"
        self._exists = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE artifact_id = $1 AND {_LIVE})"

    @property
    def retention(self) -> ArtifactRetentionConfig:
        """The retention limits in force."""
        return self._retention

    # -- writes -----------------------------------------------------------------------------------

    def _artifact_group_key(self, key: str) -> str:
        return to_db_text(key)

    def _prepared(
        self, put: ArtifactPut, mime_type: str | None
    ) -> tuple[tuple[Any, ...], tuple[GroupLimit, GroupLimit]]:
        """The row to insert and the artifact's groups."""
        data, ref, groups = put.data, put.ref, put.groups
        row = (
            ref["id"],
            groups[0].key,
            groups[1].key,
            len(data),
            to_db_text_opt(mime_type),
            ref["sha256"],
            dump_json(ref),
            data,
        )
        return row, groups

    async def _write(self, prepared: tuple[tuple[Any, ...], tuple[GroupLimit, GroupLimit]]) -> Any:
        return await self._put(*prepared)

    async def _put(self, row: tuple[Any, ...], groups: tuple[GroupLimit, GroupLimit]) -> Any:
        key, session_key, trace_key, size = row[0], row[1], row[2], row[3]

        async def put(conn: Connection) -> Any:
            async with transaction(conn):
                locks = sorted(self._lock_name(group) for group in groups)
                for lock in locks:
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", lock)
                await conn.execute(
                    f"DELETE FROM {self._table} WHERE NOT {_LIVE} AND (artifact_id = $1 OR "
                    f"{_eq('session_key', 2, session_key)} OR {_eq('trace_key', 3, trace_key)})",
                    key,
                    session_key,
                    trace_key,
                )
                existing = await conn.fetchval(self._refresh, key)
                if existing is not None:
                    return existing
                victims = await self._plan(conn, groups, size, session_key, trace_key)
                if victims:
                    await conn.execute(
                        f"DELETE FROM {self._table} WHERE artifact_id = ANY($1::text[])", victims
                    )
                return await conn.fetchval(self._insert, *row)

        return self._decode_ref(await self._db.run(put))

    def _lock_name(self, group: GroupLimit) -> str:
        """The advisory lock serialising puts into one session or trace group."""
        key = "" if group.key is None else "k" + group.key
        return f"guarded.artifacts:{self._schema}:{group.group}:{key}"

    async def _plan(
        self,
        conn: Connection,
        groups: tuple[GroupLimit, ...],
        size: int,
        session_key: str | None,
        trace_key: str | None,
    ) -> list[str]:
        if all(group.max_count <= 0 and group.max_bytes <= 0 for group in groups):
            return []
        order = "used_seq" if self._retention.cleanup_strategy == "lru" else "inserted_seq"
        records = await conn.fetch(
            f"SELECT artifact_id, size_bytes, {order} AS ord, session_key, trace_key FROM {self._table} "
            f"WHERE {_eq('session_key', 1, session_key)} OR {_eq('trace_key', 2, trace_key)}",
            session_key,
            trace_key,
        )
        members = [
            _Member(
                record["artifact_id"],
                record["size_bytes"],
                record["ord"],
                record["session_key"],
                record["trace_key"],
            )
            for record in records
        ]
        return plan_member_evictions(members, groups, size, self._retention.cleanup_strategy)

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, artifact_id: str) -> bytes | None:
        """The artifact's bytes, or ``None`` when missing or expired; counts as use for ``lru``."""
        with refusing("artifact_store.get"):
            key = check_text(artifact_id, "artifact_id")
        sql = self._get_touch if self._retention.cleanup_strategy == "lru" else self._get
        data = await self._db.fetchval(sql, key)
        return None if data is None else bytes(data)

    async def get_ref(self, artifact_id: str) -> Any:
        """The artifact's ref, or ``None`` when missing or expired."""
        with refusing("artifact_store.get_ref"):
            key = check_text(artifact_id, "artifact_id")
        text = await self._db.fetchval(self._get_ref, key)
        return None if text is None else self._decode_ref(text)

    async def delete(self, artifact_id: str) -> bool:
        """Delete the artifact; ``False`` when it was missing or already expired."""
        with refusing("artifact_store.delete"):
            key = check_text(artifact_id, "artifact_id")
        live = await self._db.fetchval(self._delete, key)
        return bool(live)

    async def exists(self, artifact_id: str) -> bool:
        """Whether the artifact is stored and not expired."""
        with refusing("artifact_store.exists"):
            key = check_text(artifact_id, "artifact_id")
        return bool(await self._db.fetchval(self._exists, key))

    async def list(self, *, scope: Any = None) -> builtins.list[Any]:
        """Refs of live artifacts in insertion order; ``scope``'s non-``None`` fields must all match."""
        wanted: dict[str, Any] = {}
        if scope is not None:
            try:
                wanted = {
                    name: value for name, value in ARTIFACT_SCOPE.encode(scope).items() if value is not None
                }
            except InvalidPayloadError as exc:
                raise exc.at("scope") from None
        conditions = [_LIVE]
        args: builtins.list[Any] = []
        for name, column in (("session_id", "session_key"), ("trace_id", "trace_key")):
            if name in wanted:
                args.append(to_db_text(str(wanted[name])))
                conditions.append(f"{column} = ${len(args)}")
        records = await self._db.fetch(
            f"SELECT ref FROM {self._table} WHERE {' AND '.join(conditions)} ORDER BY inserted_seq", *args
        )
        refs = []
        for record in records:
            data = loads_json(record[0])
            ref_scope = data.get("scope") or {}
            if all(ref_scope.get(name) == value for name, value in wanted.items()):
                refs.append(ARTIFACT_REF.decode(data, self._types))
        return refs

    def _decode_ref(self, text: str) -> Any:
        return ARTIFACT_REF.decode(loads_json(text), self._types)


def _eq(column: str, index: int, value: str | None) -> str:
    """``column = $index``, or ``column IS NULL`` (with a typed no-op use of the parameter) for ``None``."""
    if value is None:
        return f"({column} IS NULL AND ${index}::text IS NULL)"
    return f"{column} = ${index}"


__all__ = [
    "ArtifactLimitError",
    "ArtifactTooLargeError",
    "PostgresArtifactStore",
    "plan_member_evictions",
]
