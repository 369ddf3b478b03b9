-- Append items to a session's stream (updates or steering), each once by its id.
-- KEYS[1]: the stream (fields: task, d); KEYS[2]: the hash item id -> stream entry id
-- ARGV: ttl in ms, then per item: item id, task id, doc JSON
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    local entry = redis.call('XADD', KEYS[1], '*', 'task', ARGV[i + 1], 'd', ARGV[i + 2])
    redis.call('HSET', KEYS[2], ARGV[i], entry)
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
