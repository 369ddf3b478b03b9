"""Planner pause state: a TTL, and consume-once that is safe to retry.

``save_planner_state`` upserts the payload with ``expires_at = now() + ttl`` (database clock;
default one hour). Saving a token again replaces its payload, restarts its TTL and makes it
consumable again, exactly like the reference store.

``load_planner_state`` consumes the token. The problem it must solve: if the response is lost
after the database ran the consume, a blind retry finds nothing and the pause is gone. So:

* **With an idempotency key** (:func:`guarded.pipeline.idempotency.current_idempotency_key`, set by the
  guard for each logical call and reused by its retries) the consume *marks* the row --
  ``consumed_at = now(), consumer_key = key`` -- instead of deleting it. When the mark finds
  the row already consumed, a second statement (with a fresh snapshot, so it sees a concurrent
  consume that just committed) returns the payload again if the row was consumed *by the same
  key* less than ``consume_grace`` seconds ago. Any other caller gets ``None``. Consumed rows
  are deleted by ``cleanup()`` once the grace period is over.
* **Recovering unanswered consumes.** A consume whose answer never reached its caller (it timed
  out, was cancelled, lost its connection) may have been committed: the row is then consumed by a
  key nobody will use again. The guard keeps such keys and gives them, once, to the next consume
  of the token (:func:`guarded.pipeline.idempotency.current_unanswered_keys`). With them the mark also
  takes a row consumed by one of those keys less than ``consume_grace`` seconds ago, and moves it
  to the current key (``consumed_at = now(), consumer_key = key``) in the same statement: a
  concurrent consume waits on the row lock and then sees the row consumed by another key, so the
  payload goes to exactly one caller, and the old key no longer gets it either.
* **Without a key** nobody can ask again, so the row is deleted and returned in one statement
  (``DELETE ... RETURNING``), the spec's implementation.

Missing, expired and consumed tokens all read as ``None`` (never ``{}``).

:meth:`Pauses.save_many` (``save_planner_states``) is the same upsert for many tokens in one
``INSERT ... SELECT FROM unnest(...)`` statement: every token gets the TTL and becomes consumable
again as with single saves, the last payload of a token winning (:mod:`.bulk`).

A save is last-write-wins by logical time (:mod:`guarded.logical_time`): a direct save is always
applied (the row's time only grows); a replayed one older than the save that set the row leaves it
alone (payload, TTL and consumption), from any process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guarded.logical_time import LOGICAL_TIMES, current_logical_time
from guarded.pipeline.idempotency import current_idempotency_key, current_unanswered_keys

from .bulk import last_per_key, last_write_wins, upsert_many, upsert_one, with_logical_times
from .connection import Connection, Database
from .json_codec import check_text, dump_json_object, loads_json, to_db_text
from .schema_names import qualified


class Pauses:
    """SQL of the ``planner_pauses`` table."""

    def __init__(self, db: Database, schema: str, *, ttl: float, grace: float) -> None:
        self._db = db
        self.ttl = ttl
        self.grace = grace
        table = qualified(schema, "planner_pauses")
        on_conflicts = [
            f"ON CONFLICT (token) DO UPDATE SET {rule}"
            for rule in last_write_wins(
                "payload = EXCLUDED.payload, created_at = now(), "
                "expires_at = EXCLUDED.expires_at, consumed_at = NULL, consumer_key = NULL"
            )
        ]
        self.upsert = tuple(
            f"INSERT INTO {table} AS stored (token, payload, expires_at, logical_time) "
            f"VALUES ($1, $2, now() + make_interval(secs => $3), $4) {on_conflict}"
            for on_conflict in on_conflicts
        )
        """The statement of a direct save, and of a replay."""
        self.upsert_many = tuple(
            f"INSERT INTO {table} AS stored (token, payload, expires_at, logical_time) "
            "SELECT token, payload, now() + make_interval(secs => $3), logical_time "
            "FROM unnest($1::text[], $2::json[], $4::int8[]) AS batch(token, payload, logical_time) "
            f"{on_conflict}"
            for on_conflict in on_conflicts
        )
        self.take = (
            f"DELETE FROM {table} WHERE token = $1 AND consumed_at IS NULL AND expires_at > now() "
            "RETURNING payload"
        )
        self.take_saved_by = (
            f"DELETE FROM {table} WHERE token = $1 AND consumed_at IS NULL AND expires_at > now() "
            "AND logical_time <= $2 RETURNING payload"
        )
        self.mark = (
            f"UPDATE {table} SET consumed_at = now(), consumer_key = $2 "
            "WHERE token = $1 AND consumed_at IS NULL AND expires_at > now() RETURNING payload"
        )
        self.recover = (
            f"UPDATE {table} SET consumed_at = now(), consumer_key = $2 WHERE token = $1 AND "
            "((consumed_at IS NULL AND expires_at > now()) OR (consumer_key = ANY($3::text[]) "
            "AND consumed_at > now() - make_interval(secs => $4))) RETURNING payload"
        )
        self.repeat = (
            f"SELECT payload FROM {table} WHERE token = $1 AND consumer_key = $2 "
            "AND consumed_at > now() - make_interval(secs => $3)"
        )

    @staticmethod
    def encode(token: Any, payload: Any) -> tuple[str, str]:
        """Validate the arguments of ``save_planner_state``."""
        return to_db_text(check_text(token, "token")), dump_json_object(payload, "payload")

    async def save(self, token: str, payload: str) -> None:
        await upsert_one(
            self._db, self.upsert, "save_planner_state", token, payload, self.ttl, current_logical_time()
        )

    async def save_many(self, rows: Sequence[tuple[str, str]]) -> None:
        """Upsert encoded ``(token, payload)`` rows in one statement; the last row of a token wins."""
        if not rows:
            return
        timed = with_logical_times(rows)
        unique = sorted(last_per_key(timed, lambda row: row[0]))  # token order: no deadlocks
        if len(unique) == 1:
            token, payload, time = unique[0]
            await upsert_one(self._db, self.upsert, "save_planner_states", token, payload, self.ttl, time)
            return
        tokens, payloads, times = zip(*unique, strict=True)
        await upsert_many(
            self._db, self.upsert_many, "save_planner_states", len(unique), tokens, payloads, self.ttl, times
        )

    async def load(self, token: Any) -> dict[str, Any] | None:
        key = to_db_text(check_text(token, "token"))
        consumer = current_idempotency_key()
        saved_by = LOGICAL_TIMES.get()
        if consumer is None and saved_by is not None:
            # The guard's replay of a consume held for a save with this logical time: a newer
            # save of the token is not the one that consume was for.
            text = await self._db.fetchval_once(self.take_saved_by, key, saved_by[0])
        elif consumer is None:
            text = await self._db.fetchval_once(self.take, key)
        else:
            consumer_key = to_db_text(check_text(consumer, "idempotency_key"))
            unanswered = [to_db_text(check_text(old, "unanswered key")) for old in current_unanswered_keys()]

            async def consume(conn: Connection) -> Any:
                if unanswered:
                    found = await conn.fetchval(self.recover, key, consumer_key, unanswered, self.grace)
                else:
                    found = await conn.fetchval(self.mark, key, consumer_key)
                if found is None:
                    found = await conn.fetchval(self.repeat, key, consumer_key, self.grace)
                return found

            text = await self._db.run(consume)
        if text is None:
            return None
        payload: dict[str, Any] = loads_json(text)
        return payload


__all__ = ["Pauses"]
