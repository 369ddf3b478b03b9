"""Planner trajectories: one per trace; ``list_traces`` as PenguiFlow's reference store answers it.

``get_trajectory`` answers for the session of the trace's last save only (``trajectories``, one
row per trace). ``list_traces`` lists every trace ever saved under the session, most recently
saved there first (``session_traces``, one row per session and trace, written by the same
statement as the trajectory): as in PenguiFlow 3.11's ``InMemoryStateStore``, saving a trace under
another session does not remove it from the listing of the sessions it was saved under before.
``limit`` is PenguiFlow's ``[:limit]`` (``0``: none, ``-n``: all but the last ``n``).

A trajectory is stored in :func:`guarded.codec.encode_trajectory`'s lossless envelope: a mapping,
or an object with ``serialise()`` (PenguiFlow's ``Trajectory``) tagged with its type so it comes
back as that type. Every save takes the next value of the schema's sequence, so ``list_traces``
orders by the last save (saving a trace again moves it to the front).

:meth:`Trajectories.save_many` (``save_trajectories``) upserts many traces in one ``INSERT ...
SELECT FROM unnest(...)`` statement. Each trace keeps its last item, every item's session lists
its trace, and the sequence values are taken in list order, so ``list_traces`` orders the traces
exactly as single saves in list order would.

Last-write-wins by logical time (:mod:`guarded.backend`): a direct save is always applied (the
row's time only grows); a replayed save older than the one that set the row leaves it alone (a late
replay never undoes a newer save, from any process) and does not list the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guarded.backend import current_logical_time
from guarded.codec import decode_trajectory, encode_trajectory
from guarded.errors import InvalidPayloadError

from .bulk import last_write_wins, upsert_many, upsert_one, with_logical_times
from .connection import Database
from .json_codec import check_text, dump_json, from_db_text, loads_json, to_db_text
from .schema_names import next_seq, qualified


class Trajectories:
    """SQL of the ``trajectories`` table."""

    def __init__(self, db: Database, schema: str) -> None:
        self._db = db
        table = qualified(schema, "trajectories")
        rules = last_write_wins(
            "session_id = EXCLUDED.session_id, doc = EXCLUDED.doc, saved_seq = EXCLUDED.saved_seq, "
            "updated_at = now()"
        )
        on_conflicts = [f"ON CONFLICT (trace_id) DO UPDATE SET {rule}" for rule in rules]
        listed = qualified(schema, "session_traces")
        returning = ", stored.trace_id, stored.session_id, stored.saved_seq"
        # Only a save the last-write-wins rule applied is RETURNed, and so listed.
        list_saved = (
            f"listed AS (INSERT INTO {listed} (session_id, trace_id, saved_seq) "
            "SELECT session_id, trace_id, saved_seq FROM saved "
            "ON CONFLICT (session_id, trace_id) DO UPDATE SET saved_seq = EXCLUDED.saved_seq) "
            "SELECT logical_time FROM saved"
        )
        self.upsert = tuple(
            f"WITH saved AS (INSERT INTO {table} AS stored "
            "(trace_id, session_id, doc, logical_time, saved_seq) "
            f"VALUES ($1, $2, $3, $4, {next_seq(schema)}) {on_conflict}{returning}), {list_saved}"
            for on_conflict in on_conflicts
        )
        """The statement of a direct save, and of a replay."""
        # The CTE takes the sequence values in batch order (PostgreSQL evaluates nextval, a volatile
        # output expression, after the ORDER BY sort, and materialises a CTE calling it once); the
        # last item of each trace goes to the trajectories in trace order, so concurrent bulk writes
        # lock shared rows in one order. Every session an item names lists its trace, with the seq
        # of its last item there, when that item passes the check against the stored row (the
        # statement's snapshot), exactly as single saves in batch order would.
        # A direct save lists every item's trace; a replayed item only when it is not older than
        # the stored row.
        replayed_item = "WHERE stored.trace_id IS NULL OR stored.logical_time <= batch.logical_time "
        self.upsert_many = tuple(
            "WITH batch AS (SELECT trace_id, session_id, doc, logical_time, ord, "
            f"{next_seq(schema)} AS saved_seq "
            "FROM unnest($1::text[], $2::text[], $3::json[], $4::int8[]) WITH ORDINALITY "
            "AS item(trace_id, session_id, doc, logical_time, ord) ORDER BY ord), "
            "last AS (SELECT DISTINCT ON (trace_id) * FROM batch ORDER BY trace_id, ord DESC), "
            f"saved AS (INSERT INTO {table} AS stored (trace_id, session_id, doc, logical_time, saved_seq) "
            "SELECT trace_id, session_id, doc, logical_time, saved_seq FROM last "
            f"ORDER BY trace_id {on_conflict}), "
            f"listed AS (INSERT INTO {listed} (session_id, trace_id, saved_seq) "
            "SELECT DISTINCT ON (batch.session_id, batch.trace_id) "
            "batch.session_id, batch.trace_id, batch.saved_seq "
            f"FROM batch LEFT JOIN {table} AS stored ON stored.trace_id = batch.trace_id "
            f"{condition}"
            "ORDER BY batch.session_id, batch.trace_id, batch.ord DESC "
            "ON CONFLICT (session_id, trace_id) DO UPDATE SET saved_seq = EXCLUDED.saved_seq) "
            "SELECT logical_time FROM saved"
            for on_conflict, condition in zip(on_conflicts, ("", replayed_item), strict=True)
        )
        self.select = f"SELECT doc FROM {table} WHERE trace_id = $1 AND session_id = $2"
        self.recent = f"SELECT trace_id FROM {listed} WHERE session_id = $1 ORDER BY saved_seq DESC LIMIT $2"

    @staticmethod
    def encode(trace_id: Any, session_id: Any, trajectory: Any) -> tuple[str, str, str]:
        """Validate the arguments of ``save_trajectory``."""
        return (
            to_db_text(check_text(trace_id, "trace_id")),
            to_db_text(check_text(session_id, "session_id")),
            dump_json(encode_trajectory(trajectory, "trajectory")),
        )

    async def save(self, row: tuple[str, str, str]) -> None:
        await upsert_one(self._db, self.upsert, "save_trajectory", *row, current_logical_time())

    async def save_many(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Upsert encoded rows in one statement, as single saves in order (the last of a trace wins
        its row; every session named lists the trace)."""
        if not rows:
            return
        timed = with_logical_times(rows)
        if len(timed) == 1:
            await upsert_one(self._db, self.upsert, "save_trajectories", *timed[0])
            return
        traces = len({row[0] for row in timed})
        await upsert_many(self._db, self.upsert_many, "save_trajectories", traces, *zip(*timed, strict=True))

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
        if limit == 0:
            return []
        # LIMIT NULL is no limit: a negative limit reads them all and slices as PenguiFlow.
        records = await self._db.fetch(self.recent, session, limit if limit > 0 else None)
        traces = [from_db_text(record[0]) for record in records]
        return traces if limit > 0 else traces[:limit]


__all__ = ["Trajectories"]
