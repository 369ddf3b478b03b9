"""Short-term memory state: an upsert per key, read back exactly (spec 000 §6, §7).

Last-write-wins by logical time (:mod:`guarded.backend`): each row keeps the logical time of
the write that set it. A direct upsert is always applied (the row's time only grows); a replayed
one with an older time leaves the row alone -- so a write held during an outage and replayed later
never undoes a newer write, from any process, and a clock behind another host's never drops a
live write.

:meth:`MemoryStates.save_many` upserts many keys in one ``INSERT ... SELECT FROM unnest(...)``
statement, the last state of a key winning (:mod:`.bulk`). The rows go in key order, so two
concurrent bulk writes of overlapping keys lock them in the same order and cannot deadlock.

:meth:`MemoryStates.keys_of_session` (``list_memory_keys``) lists the keys of a session: those
ending with ``:{session_id}``, spec 003's ``tenant:user:session``. It reads the whole table (no
index serves a suffix); a capture calls it once per session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guarded.backend import current_logical_time

from .bulk import last_per_key, last_write_wins, upsert_many, upsert_one, with_logical_times
from .connection import Database
from .json_codec import check_text, dump_json_object, from_db_text, loads_json, to_db_text
from .schema_names import qualified


class MemoryStates:
    """SQL of the ``memory_states`` table."""

    def __init__(self, db: Database, schema: str) -> None:
        self._db = db
        table = qualified(schema, "memory_states")
        rules = last_write_wins("state = EXCLUDED.state, updated_at = now()")
        self.upsert = tuple(
            f"INSERT INTO {table} AS stored (key, state, logical_time) VALUES ($1, $2, $3) "
            f"ON CONFLICT (key) DO UPDATE SET {rule}"
            for rule in rules
        )
        """The statement of a direct write, and of a replay."""
        self.upsert_many = tuple(
            f"INSERT INTO {table} AS stored (key, state, logical_time) SELECT key, state, logical_time "
            "FROM unnest($1::text[], $2::json[], $3::int8[]) AS batch(key, state, logical_time) "
            f"ON CONFLICT (key) DO UPDATE SET {rule}"
            for rule in rules
        )
        self.select = f"SELECT state FROM {table} WHERE key = $1"
        # A suffix compared as text, not a LIKE pattern: a session id's % and _ are plain characters.
        self.keys_ending = f"SELECT key FROM {table} WHERE right(key, char_length($1)) = $1"

    @staticmethod
    def encode(key: Any, state: Any) -> tuple[str, str]:
        """Validate the arguments of ``save_memory_state``."""
        return to_db_text(check_text(key, "key")), dump_json_object(state, "state")

    async def save(self, key: str, state: str) -> None:
        await upsert_one(self._db, self.upsert, "save_memory_state", key, state, current_logical_time())

    async def save_many(self, rows: Sequence[tuple[str, str]]) -> None:
        """Upsert encoded ``(key, state)`` rows in one statement; the last row of a key wins."""
        if not rows:
            return
        timed = with_logical_times(rows)
        unique = sorted(last_per_key(timed, lambda row: row[0]))
        if len(unique) == 1:
            await upsert_one(self._db, self.upsert, "save_memory_states", *unique[0])
            return
        await upsert_many(
            self._db, self.upsert_many, "save_memory_states", len(unique), *zip(*unique, strict=True)
        )

    async def keys_of_session(self, session_id: Any) -> list[str]:
        """The keys ending with ``:{session_id}``, sorted by code point."""
        suffix = to_db_text(":" + check_text(session_id, "session_id"))
        rows = await self._db.fetch(self.keys_ending, suffix)
        return sorted(from_db_text(row[0]) for row in rows)

    async def load(self, key: Any) -> dict[str, Any] | None:
        text = await self._db.fetchval(self.select, to_db_text(check_text(key, "key")))
        if text is None:
            return None
        state: dict[str, Any] = loads_json(text)
        return state


__all__ = ["MemoryStates"]
