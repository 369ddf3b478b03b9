-- A consumed pause stays as its token's tombstone: the consume no longer deletes the row, it
-- raises the row's logical time to the consume's and moves expires_at to the pause TTL after the
-- consume; cleanup() deletes it only then. A save replaces a consumed row only when it is strictly
-- newer, so no replay of an older save makes the token consumable again.
-- Rows consumed before this migration become tombstones the same way, kept at least an hour (the
-- default pause TTL) after their consume, with the consume's wall-clock time as logical time.
UPDATE planner_pauses
SET expires_at = greatest(expires_at, consumed_at + interval '1 hour'),
    logical_time = greatest(logical_time, (extract(epoch FROM consumed_at) * 1000000)::bigint)
WHERE consumed_at IS NOT NULL;
