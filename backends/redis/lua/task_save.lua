-- Upsert a task unless the stored one has a newer updated_at (a task never goes backwards).
-- KEYS[1]: the task (a hash: updated, session, doc)
-- ARGV: ttl in ms, updated_at in microseconds since the epoch, session id, doc JSON
-- Returns: applied (1/0), whether it had a session (1/0), the session it had.
local stored = redis.call('HMGET', KEYS[1], 'updated', 'session')
local updated = tonumber(stored[1])
if updated ~= nil and updated > tonumber(ARGV[2]) then return {0, 1, stored[2]} end
redis.call('HSET', KEYS[1], 'updated', ARGV[2], 'session', ARGV[3], 'doc', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
if updated == nil then return {1, 0, ''} end
return {1, 1, stored[2]}
