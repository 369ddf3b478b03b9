-- Upsert remote bindings, last-write-wins by logical time.
-- KEYS[i]: the binding of item i (a hash: lt, doc, terminal, router, first); all of one trace
-- ARGV: replay, ttl in ms, then per item: logical time, doc JSON, terminal ('1'/'0'),
--       router session ('' none, else 'v' .. id), first-saved score
-- Returns per item: applied (1/0), the record's time, the router before ('' none, else 'v' ..),
-- the record's first-saved score.
local replay = ARGV[1] == '1'
local ttl = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local base = 3 + (i - 1) * 5
  local stored = redis.call('HMGET', KEYS[i], 'lt', 'router', 'first')
  local time = lww(tonumber(stored[1]), tonumber(ARGV[base]), replay)
  local before = stored[2] or ''
  local first = stored[3] or ARGV[base + 4]
  if time == nil then
    out[#out + 1] = {0, tonumber(stored[1]), before, first}
  else
    redis.call('HSET', KEYS[i], 'lt', fmt(time), 'doc', ARGV[base + 1], 'terminal', ARGV[base + 2],
      'router', ARGV[base + 3], 'first', first)
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[#out + 1] = {1, time, before, first}
  end
end
return out
