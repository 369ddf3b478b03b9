-- Upsert a trace's trajectory, last-write-wins by logical time.
-- KEYS[1]: the trajectory (a hash: lt, session, doc)
-- ARGV: replay, ttl in ms, then per item: logical time, session id, document JSON
-- Returns per item: applied (1/0), the record's time.
local replay = ARGV[1] == '1'
local ttl = tonumber(ARGV[2])
local out = {}
for base = 3, #ARGV, 3 do
  local stored = tonumber(redis.call('HGET', KEYS[1], 'lt'))
  local time = lww(stored, tonumber(ARGV[base]), replay)
  if time == nil then
    out[#out + 1] = 0
    out[#out + 1] = stored
  else
    redis.call('HSET', KEYS[1], 'lt', fmt(time), 'session', ARGV[base + 1], 'doc', ARGV[base + 2])
    redis.call('PEXPIRE', KEYS[1], ttl)
    out[#out + 1] = 1
    out[#out + 1] = time
  end
end
return out
