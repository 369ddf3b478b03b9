-- Save planner pauses, last-write-wins by logical time, each consumable again.
-- KEYS[i]: the pause of item i (a hash: lt, payload, consumed, consumer, consumed_ms); one token
-- ARGV: replay, then per item: logical time, ttl left in ms, payload JSON
-- A consumed pause (a tombstone) is replaced by a replay only when the replay is strictly newer.
-- Returns per item: applied (1/0), the record's time.
local replay = ARGV[1] == '1'
local out = {}
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 3
  local stored = redis.call('HMGET', KEYS[i], 'lt', 'consumed')
  local stored_time = tonumber(stored[1])
  local lt = tonumber(ARGV[base])
  local time = lww(stored_time, lt, replay)
  if time ~= nil and replay and stored[2] == '1' and lt <= stored_time then time = nil end
  if time == nil then
    out[#out + 1] = 0
    out[#out + 1] = stored_time
  else
    redis.call('DEL', KEYS[i])
    redis.call('HSET', KEYS[i], 'lt', fmt(time), 'payload', ARGV[base + 2], 'consumed', '0')
    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[base + 1]))
    out[#out + 1] = 1
    out[#out + 1] = time
  end
end
return out
