"""Planner pause state: a TTL, and consume-once that is safe to retry.

``save_planner_state`` upserts the payload with ``expires_at = now() + ttl`` (database clock;
default one hour). Saving a token again replaces its payload, restarts its TTL and makes it
consumable again, exactly like the reference store.

``load_planner_state`` consumes the token. The problem it must solve: if the response is lost
after the database ran the consume, a blind retry finds nothing and the pause is gone. So:

* **With an idempotency key** (:func:`guarded.backend.current_idempotency_key`, set by the
  guard for each logical call and reused by its retries) the consume *marks* the row --
  ``consumed_at = now(), consumer_key = key`` -- instead of deleting it. When the mark finds
  the row already consumed, a second statement (with a fresh snapshot, so it sees a concurrent
  consume that just committed) returns the payload again if the row was consumed *by the same
  key* less than ``consume_grace`` seconds ago. Any other caller gets ``None``. Consumed rows
  are deleted by ``cleanup()`` once the grace period is over.
* **Recovering unanswered consumes.** A consume whose answer never reached its caller (it timed
  out, was cancelled, lost its connection) may have been committed: the row is then consumed by a
  key nobody will use again. The guard keeps such keys and gives them, once, to the next consume
  of the token (:func:`guarded.backend.current_unanswered_keys`). With them the mark also
  takes a row consumed by one of those keys less than ``consume_grace`` seconds ago, and moves it
  to the current key (``consumed_at = now(), consumer_key = key``) in the same statement: a
  concurrent consume waits on the row lock and then sees the row consumed by another key, so the
  payload goes to exactly one caller, and the old key no longer gets it either.
* **Without a key** nobody can ask again: the row is marked consumed and returned in one statement
  (``UPDATE ... RETURNING``).

**Tombstones.** A consumed row is never deleted by the consume: it stays as the token's tombstone,
its logical time raised to the consume's, and ``cleanup()`` keeps it until the pause TTL after the
consume has passed (``expires_at`` is moved there). A save replaces a tombstone only when its
logical time is strictly newer, so a replay of the consumed save, or of any save called before the
consume, never makes the token consumable again. A save's TTL counts from its call's logical time:
a replay of a save that would have expired stores nothing, so once the tombstone is gone no save
it refused can come back either.

Missing, expired and consumed tokens all read as ``None`` (never ``{}``).

:meth:`Pauses.save_many` (``save_planner_states``) is the same upsert for many tokens in one
``INSERT ... SELECT FROM unnest(...)`` statement: every token gets the TTL and becomes consumable
again as with single saves, the last payload of a token winning (:mod:`.bulk`).

A save is last-write-wins by logical time (:mod:`guarded.backend`): a direct save is always
applied (the row's time only grows); a replayed one older than the save that set the row leaves it
alone (payload, TTL and consumption), from any process, and a replayed one not newer than a
consume's tombstone never revives the token. The guard's replay of a consume held for a save
(``LOGICAL_TIMES`` set, no idempotency key) consumes the row only when it is not newer than that
save, and leaves a tombstone with the save's time whatever it finds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guarded.backend import (
    LOGICAL_TIMES,
    current_idempotency_key,
    current_logical_time,
    current_unanswered_keys,
    ttl_left,
)

from .bulk import last_per_key, last_write_wins, upsert_many, upsert_one, with_logical_times
from .connection import Connection, Database, one_transaction
from .json_codec import check_text, dump_json_object, loads_json, to_db_text
from .schema_names import qualified


class Pauses:
    """SQL of the ``planner_pauses`` table."""

    def __init__(self, db: Database, schema: str, *, ttl: float, grace: float) -> None:
        self._db = db
        self.ttl = ttl
        self.grace = grace
        table = qualified(schema, "planner_pauses")
        # A consumed row (a tombstone) is replaced by a replay only when the replay is strictly newer:
        # a replay of the save it consumed, or of any save called before the consume, never revives
        # the token.
        on_conflicts = [
            f"ON CONFLICT (token) DO UPDATE SET {rule}"
            for rule in last_write_wins(
                "payload = EXCLUDED.payload, created_at = now(), "
                "expires_at = EXCLUDED.expires_at, consumed_at = NULL, consumer_key = NULL",
                replay_also="(stored.consumed_at IS NULL OR stored.logical_time < EXCLUDED.logical_time)",
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
            "SELECT token, payload, now() + make_interval(secs => ttl), logical_time "
            "FROM unnest($1::text[], $2::json[], $3::float8[], $4::int8[]) "
            f"AS batch(token, payload, ttl, logical_time) {on_conflict}"
            for on_conflict in on_conflicts
        )
        # A consume marks the row instead of deleting it: it stays as the token's tombstone, with
        # the consume's logical time and kept by cleanup() until the pause TTL after the consume.
        consumed = (
            "consumed_at = now(), logical_time = greatest(logical_time, $3), "
            "expires_at = now() + make_interval(secs => $4)"
        )
        live = "token = $1 AND consumed_at IS NULL AND expires_at > now()"
        self.take = f"UPDATE {table} SET {consumed}, consumer_key = $2 WHERE {live} RETURNING payload"
        self.take_saved_by = (
            f"UPDATE {table} SET {consumed}, consumer_key = $2 WHERE {live} AND logical_time <= $3 "
            "RETURNING payload"
        )
        self.tombstone = (
            f"INSERT INTO {table} AS stored (token, payload, expires_at, consumed_at, logical_time) "
            "VALUES ($1, 'null', now() + make_interval(secs => $2), now(), $3) ON CONFLICT (token) DO UPDATE "
            "SET consumed_at = coalesce(stored.consumed_at, now()), logical_time = EXCLUDED.logical_time, "
            "expires_at = greatest(stored.expires_at, EXCLUDED.expires_at) "
            "WHERE stored.logical_time <= EXCLUDED.logical_time "
            "AND (stored.consumed_at IS NOT NULL OR stored.expires_at <= now())"
        )
        self.mark = self.take
        self.recover = (
            f"UPDATE {table} SET {consumed}, consumer_key = $2 WHERE token = $1 AND "
            "((consumed_at IS NULL AND expires_at > now()) OR (consumer_key = ANY($5::text[]) "
            "AND consumed_at > now() - make_interval(secs => $6))) RETURNING payload"
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
        time = current_logical_time()
        left = ttl_left(self.ttl, time)
        if left > 0:
            await upsert_one(self._db, self.upsert, "save_planner_state", token, payload, left, time)

    async def save_many(self, rows: Sequence[tuple[str, str]]) -> None:
        """Upsert encoded ``(token, payload)`` rows in one statement; the last row of a token wins."""
        if not rows:
            return
        timed = with_logical_times(rows)
        unique = sorted(last_per_key(timed, lambda row: row[0]))  # token order: no deadlocks
        with_ttl = [(token, payload, ttl_left(self.ttl, time), time) for token, payload, time in unique]
        living = [row for row in with_ttl if row[2] > 0]
        if len(living) == 1:
            token, payload, left, time = living[0]
            await upsert_one(self._db, self.upsert, "save_planner_states", token, payload, left, time)
        elif living:
            tokens, payloads, lefts, times = zip(*living, strict=True)
            await upsert_many(
                self._db, self.upsert_many, "save_planner_states", len(living), tokens, payloads, lefts, times
            )

    async def load(self, token: Any) -> dict[str, Any] | None:
        key = to_db_text(check_text(token, "token"))
        consumer = current_idempotency_key()
        saved_by = LOGICAL_TIMES.get()
        ttl = self.ttl
        if consumer is None and saved_by is not None:
            # The guard's replay of a consume held for a save with this logical time: a newer
            # save of the token is not the one that consume was for. Whatever it finds (nothing,
            # an expired row), it leaves a tombstone, so no replay of an older save revives it.
            [saved_at] = saved_by[:1]

            async def consume_held(conn: Connection) -> Any:
                async with one_transaction(self._db, conn):
                    found = await conn.fetchval(self.take_saved_by, key, None, saved_at, ttl)
                    if found is None:
                        await conn.execute(self.tombstone, key, ttl, saved_at)
                return found

            text = await self._db.run(consume_held, repeat_safe=False)
        elif consumer is None:
            text = await self._db.fetchval_once(self.take, key, None, current_logical_time(), ttl)
        else:
            consumer_key = to_db_text(check_text(consumer, "idempotency_key"))
            unanswered = [to_db_text(check_text(old, "unanswered key")) for old in current_unanswered_keys()]
            time = current_logical_time()

            async def consume(conn: Connection) -> Any:
                async with one_transaction(self._db, conn):
                    if unanswered:
                        found = await conn.fetchval(
                            self.recover, key, consumer_key, time, ttl, unanswered, self.grace
                        )
                    else:
                        found = await conn.fetchval(self.mark, key, consumer_key, time, ttl)
                    if found is None:
                        found = await conn.fetchval(self.repeat, key, consumer_key, self.grace)
                return found

            text = await self._db.run(consume)
        if text is None:
            return None
        payload: dict[str, Any] = loads_json(text)
        return payload


__all__ = ["Pauses"]
