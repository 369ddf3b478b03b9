-- Upsert memory states, last-write-wins by logical time, and list their keys in the index.
-- KEYS[1]: the index of the keys (member: the memory key; score: when its record expires, in ms)
-- KEYS[2..]: one record per item (a hash: lt, state)
-- ARGV: replay ('1'/'0'), ttl in ms, then per item: logical time, memory key, state JSON
-- Returns per item: applied (1/0), the record's time.
local replay = ARGV[1] == '1'
local ttl = tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 2, #KEYS do
  local base = 3 + (i - 2) * 3
  local stored = tonumber(redis.call('HGET', KEYS[i], 'lt'))
  local time = lww(stored, tonumber(ARGV[base]), replay)
  if time == nil then
    out[#out + 1] = 0
    out[#out + 1] = stored
  else
    redis.call('HSET', KEYS[i], 'lt', fmt(time), 'state', ARGV[base + 2])
    redis.call('PEXPIRE', KEYS[i], ttl)
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[base + 1])
    out[#out + 1] = 1
    out[#out + 1] = time
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return out
