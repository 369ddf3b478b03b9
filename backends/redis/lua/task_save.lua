-- Upsert a task unless the stored one has a newer updated_at (a task never goes backwards).
-- KEYS[1]: the task (a hash: updated, session, doc)
-- KEYS[2] (on a single node only: another slot): the task index of its session
-- ARGV: ttl in ms, updated_at in microseconds since the epoch, session id, doc JSON
--       (with KEYS[2]: then the index score and the task id)
-- Returns: applied (1/0), whether it had a session (1/0), the session it had.
local stored = redis.call('HMGET', KEYS[1], 'updated', 'session')
local updated = tonumber(stored[1])
if updated ~= nil and updated > tonumber(ARGV[2]) then return {0, 1, stored[2]} end
redis.call('HSET', KEYS[1], 'updated', ARGV[2], 'session', ARGV[3], 'doc', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
if KEYS[2] then
  -- A task already in this session keeps its place; one new to it is placed by this save.
  if updated ~= nil and stored[2] == ARGV[3] then
    redis.call('ZADD', KEYS[2], 'NX', ARGV[5], ARGV[6])
  else
    redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
  end
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[1]))
end
if updated == nil then return {1, 0, ''} end
return {1, 1, stored[2]}
