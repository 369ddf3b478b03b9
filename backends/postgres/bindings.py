"""Remote bindings: ``save_remote_binding`` upserts, ``find_binding`` / ``list_bindings`` /
``mark_binding_terminal`` (PenguiFlow 3.11 conversation bindings).

The key is ``(trace_id, context_id, task_id)`` as in PenguiFlow's reference store; ``context_id``
may be ``None``, so the key column ``context_key`` holds a value no real context id can have for
it. ``find_binding`` returns the most recently *saved* non-terminal binding with the given
router session, agent URL and skill whose tenant and user equal the ones asked for (``None``
matching only ``None``); ``list_bindings`` lists a router session's bindings in first-saved order.

The bulk forms are one statement each. ``save_remote_bindings`` keeps the last item of each key
(:mod:`.bulk`) but needs both orders single saves would leave: rows are inserted in the order of
each key's *first* item (the identity ``id``, ``list_bindings``' order, is taken on insert) and
take their ``saved_seq`` in the order of each key's *last* item (``find_binding``'s "most
recently saved"). ``mark_bindings_terminal`` is one ``UPDATE ... FROM unnest(...)``.

Saves and terminal marks are last-write-wins by logical time (:mod:`guarded.backend`): a
direct one is always applied (the row's time only grows); a replayed one older than the write that
last set the row leaves it alone, from any process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guarded.backend import REPLAYING, current_logical_time, merge_logical_time
from guarded.codec import REMOTE_BINDING, RecordTypes
from guarded.errors import WriteSupersededError

from .bulk import (
    last_per_key,
    last_per_key_at_first,
    last_write_wins,
    upsert_many,
    upsert_one,
    with_logical_times,
)
from .connection import Database
from .json_codec import (
    check_text,
    check_text_opt,
    dump_json,
    key_text,
    loads_json,
    to_db_text,
    to_db_text_opt,
)
from .schema_names import next_seq, qualified

BindingRow = tuple[str, str, str, str, str | None, str | None, str | None, str | None, bool, str]
"""(trace_id, context_key, task_id, agent_url, router_session_id, remote_skill, tenant_id, user_id,
is_terminal, doc)."""

BindingKey = tuple[str, str, str]
"""(trace_id, context_key, task_id) as stored."""


def encode_binding(binding: Any) -> BindingRow:
    """Validate ``binding`` and return its row (``InvalidPayloadError`` names the field)."""
    doc = REMOTE_BINDING.encode(binding)
    return (
        to_db_text(str(doc["trace_id"])),
        key_text(_opt(doc["context_id"])),
        to_db_text(str(doc["task_id"])),
        to_db_text(str(doc["agent_url"])),
        to_db_text_opt(_opt(doc.get("router_session_id"))),
        to_db_text_opt(_opt(doc.get("remote_skill"))),
        to_db_text_opt(_opt(doc.get("tenant_id"))),
        to_db_text_opt(_opt(doc.get("user_id"))),
        bool(doc.get("is_terminal", False)),
        dump_json(doc),
    )


def encode_binding_key(trace_id: Any, context_id: Any, task_id: Any) -> BindingKey:
    """Validate the arguments of ``mark_binding_terminal`` and return the stored key."""
    return (
        to_db_text(check_text(trace_id, "trace_id")),
        key_text(check_text_opt(context_id, "context_id")),
        to_db_text(check_text(task_id, "task_id")),
    )


def _opt(value: object) -> str | None:
    return value if isinstance(value, str) else None


class Bindings:
    """SQL of the ``remote_bindings`` table."""

    def __init__(self, db: Database, schema: str, types: RecordTypes) -> None:
        self._db = db
        self._types = types
        table = qualified(schema, "remote_bindings")
        columns = (
            "trace_id, context_key, task_id, agent_url, router_session_id, "
            "remote_skill, tenant_id, user_id, is_terminal, doc"
        )
        on_conflicts = [
            f"ON CONFLICT (trace_id, context_key, task_id) DO UPDATE SET {rule}"
            for rule in last_write_wins(
                "agent_url = EXCLUDED.agent_url, router_session_id = EXCLUDED.router_session_id, "
                "remote_skill = EXCLUDED.remote_skill, tenant_id = EXCLUDED.tenant_id, "
                "user_id = EXCLUDED.user_id, "
                "is_terminal = EXCLUDED.is_terminal, doc = EXCLUDED.doc, saved_seq = EXCLUDED.saved_seq, "
                "updated_at = now()"
            )
        ]
        self.upsert = tuple(
            f"INSERT INTO {table} AS stored ({columns}, logical_time, saved_seq) "
            f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, {next_seq(schema)}) {on_conflict}"
            for on_conflict in on_conflicts
        )
        """The statement of a direct save, and of a replay."""
        # The CTE takes the sequence values in the order of each key's last item (nextval, a
        # volatile output expression, is evaluated after the ORDER BY sort; a CTE with a volatile
        # function is materialised once); the INSERT then adds the rows in first-item order.
        self.upsert_many = tuple(
            f"WITH batch AS (SELECT {columns}, logical_time, ord, {next_seq(schema)} AS saved_seq "
            "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], "
            "$7::text[], $8::text[], $9::bool[], $10::json[], $11::int8[], $12::int8[]) WITH ORDINALITY "
            f"AS item({columns}, logical_time, last_pos, ord) ORDER BY last_pos) "
            f"INSERT INTO {table} AS stored ({columns}, logical_time, saved_seq) "
            f"SELECT {columns}, logical_time, saved_seq FROM batch ORDER BY ord {on_conflict}"
            for on_conflict in on_conflicts
        )
        self.find = (
            f"SELECT doc, is_terminal FROM {table} WHERE router_session_id = $1 AND agent_url = $2 "
            "AND remote_skill = $3 AND NOT is_terminal "
            "AND tenant_id IS NOT DISTINCT FROM $4 AND user_id IS NOT DISTINCT FROM $5 "
            "ORDER BY saved_seq DESC LIMIT 1"
        )
        self.list = f"SELECT doc, is_terminal FROM {table} WHERE router_session_id = $1 ORDER BY id"
        # A mark returns the row's new time; no row for an unknown binding (nothing to mark) or a
        # replay refused as older, told apart by counting the bindings that exist.
        self.mark = tuple(
            f"UPDATE {table} AS stored SET is_terminal = true, logical_time = {time}, updated_at = now() "
            f"WHERE trace_id = $1 AND context_key = $2 AND task_id = $3{condition} RETURNING logical_time"
            for time, condition in (
                ("GREATEST($4, stored.logical_time + 1)", ""),
                ("$4", " AND stored.logical_time <= $4"),
            )
        )
        self.mark_many = tuple(
            f"UPDATE {table} AS stored SET is_terminal = true, logical_time = {time}, "
            "updated_at = now() FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) "
            "AS batch(trace_id, context_key, task_id, logical_time) "
            "WHERE stored.trace_id = batch.trace_id AND stored.context_key = batch.context_key "
            f"AND stored.task_id = batch.task_id{condition} RETURNING stored.logical_time"
            for time, condition in (
                ("GREATEST(batch.logical_time, stored.logical_time + 1)", ""),
                ("batch.logical_time", " AND stored.logical_time <= batch.logical_time"),
            )
        )
        self.existing = (
            f"SELECT count(*) FROM {table} AS stored JOIN unnest($1::text[], $2::text[], $3::text[]) "
            "AS batch(trace_id, context_key, task_id) ON stored.trace_id = batch.trace_id "
            "AND stored.context_key = batch.context_key AND stored.task_id = batch.task_id"
        )

    def _decode(self, doc: str, is_terminal: bool) -> Any:
        data: Mapping[str, Any] = {**loads_json(doc), "is_terminal": is_terminal}
        return REMOTE_BINDING.decode(data, self._types)

    async def save(self, row: BindingRow) -> None:
        await upsert_one(self._db, self.upsert, "save_remote_binding", *row, current_logical_time())

    async def save_many(self, rows: Sequence[BindingRow]) -> None:
        """Upsert encoded rows in one statement, leaving what single saves in order would leave."""
        if not rows:
            return
        timed = with_logical_times(rows)
        unique = last_per_key_at_first(timed, lambda row: row[:3])
        if len(unique) == 1:
            await upsert_one(self._db, self.upsert, "save_remote_bindings", *unique[0][0])
            return
        await upsert_many(
            self._db,
            self.upsert_many,
            "save_remote_bindings",
            len(unique),
            *zip(*(row for row, _ in unique), strict=True),
            [last for _, last in unique],
        )

    async def find_binding(
        self,
        *,
        router_session_id: Any,
        agent_url: Any,
        remote_skill: Any,
        tenant_id: Any = None,
        user_id: Any = None,
    ) -> Any:
        args = (
            to_db_text(check_text(router_session_id, "router_session_id")),
            to_db_text(check_text(agent_url, "agent_url")),
            to_db_text(check_text(remote_skill, "remote_skill")),
            to_db_text_opt(check_text_opt(tenant_id, "tenant_id")),
            to_db_text_opt(check_text_opt(user_id, "user_id")),
        )
        row = await self._db.fetchrow(self.find, *args)
        return None if row is None else self._decode(row["doc"], row["is_terminal"])

    async def list_bindings(self, router_session_id: Any) -> list[Any]:
        key = to_db_text(check_text(router_session_id, "router_session_id"))
        rows = await self._db.fetch(self.list, key)
        return [self._decode(row["doc"], row["is_terminal"]) for row in rows]

    async def mark_terminal(self, *, trace_id: Any, context_id: Any, task_id: Any) -> None:
        key = encode_binding_key(trace_id, context_id, task_id)
        await self._mark("mark_binding_terminal", [(*key, current_logical_time())])

    async def mark_terminal_many(self, keys: Sequence[BindingKey]) -> None:
        """Mark the bindings of the encoded keys terminal in one statement; unknown keys: no-op."""
        if not keys:
            return
        timed = with_logical_times(keys)
        await self._mark("mark_bindings_terminal", sorted(last_per_key(timed, lambda row: row[:3])))

    async def _mark(self, method: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Mark the bindings of ``(trace_id, context_key, task_id, logical_time)`` rows terminal
        (unknown ones: nothing to do); a replay refused as older raises
        :class:`~guarded.errors.WriteSupersededError`."""
        replayed = REPLAYING.get()
        if len(rows) == 1:
            stored = await self._db.fetchval(self.mark[replayed], *rows[0])
            returned = [] if stored is None else [stored]
        else:
            returned = [
                record[0]
                for record in await self._db.fetch(self.mark_many[replayed], *zip(*rows, strict=True))
            ]
        if returned:
            merge_logical_time(max(returned))
        if replayed and len(returned) < len(rows):
            keys = [row[:3] for row in rows]
            existing = await self._db.fetchval(self.existing, *zip(*keys, strict=True))
            if existing > len(returned):
                raise WriteSupersededError(existing - len(returned), method=method)


__all__ = ["BindingKey", "BindingRow", "Bindings", "encode_binding", "encode_binding_key"]
