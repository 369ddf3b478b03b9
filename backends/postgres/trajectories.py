"""Planner trajectories: one per trace, ``list_traces`` most recently saved first.

As in the in-memory reference, a trajectory belongs to one session: saving a trace under
another session moves it there (``get_trajectory`` with the old session returns ``None`` and the
old session no longer lists it).

A trajectory is stored in :func:`guarded.codec.encode_trajectory`'s lossless envelope: a mapping,
or an object with ``serialise()`` (PenguiFlow's ``Trajectory``) tagged with its type so it comes
back as that type. Every save takes the next value of the schema's sequence, so ``list_traces``
orders by the last save (saving a trace again moves it to the front).
"""

from __future__ import annotations

from typing import Any

from guarded.codec import decode_trajectory, encode_trajectory
from guarded.errors import InvalidPayloadError

from .connection import Database
from .json_codec import check_text, dump_json, from_db_text, loads_json, to_db_text
from .schema_names import next_seq, qualified


class Trajectories:
    """SQL of the ``trajectories`` table."""

    def __init__(self, db: Database, schema: str) -> None:
        self._db = db
        table = qualified(schema, "trajectories")
        self.upsert = (
            f"INSERT INTO {table} (trace_id, session_id, doc, saved_seq) "
            f"VALUES ($1, $2, $3, {next_seq(schema)}) "
            "ON CONFLICT (trace_id) DO UPDATE SET session_id = EXCLUDED.session_id, doc = EXCLUDED.doc, "
            "saved_seq = EXCLUDED.saved_seq, updated_at = now()"
        )
        self.select = f"SELECT doc FROM {table} WHERE trace_id = $1 AND session_id = $2"
        self.recent = f"SELECT trace_id FROM {table} WHERE session_id = $1 ORDER BY saved_seq DESC LIMIT $2"

    @staticmethod
    def encode(trace_id: Any, session_id: Any, trajectory: Any) -> tuple[str, str, str]:
        """Validate the arguments of ``save_trajectory``."""
        return (
            to_db_text(check_text(trace_id, "trace_id")),
            to_db_text(check_text(session_id, "session_id")),
            dump_json(encode_trajectory(trajectory, "trajectory")),
        )

    async def save(self, row: tuple[str, str, str]) -> None:
        await self._db.execute(self.upsert, *row)

    async def get(self, trace_id: Any, session_id: Any) -> Any:
        text = await self._db.fetchval(
            self.select,
            to_db_text(check_text(trace_id, "trace_id")),
            to_db_text(check_text(session_id, "session_id")),
        )
        return None if text is None else decode_trajectory(loads_json(text))

    async def list_traces(self, session_id: Any, limit: Any = 50) -> list[str]:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidPayloadError(f"expected an integer, got {type(limit).__name__}", path="limit")
        session = to_db_text(check_text(session_id, "session_id"))
        if limit <= 0:
            return []
        records = await self._db.fetch(self.recent, session, limit)
        return [from_db_text(record[0]) for record in records]


__all__ = ["Trajectories"]
