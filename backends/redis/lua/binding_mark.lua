-- Mark remote bindings terminal, last-write-wins by logical time; an unknown binding: nothing.
-- KEYS[i]: the binding of item i (all of one trace)
-- ARGV: replay, ttl in ms, then one logical time per item
-- Returns per item: 1 applied, 0 a replay refused, 2 no such binding; then the record's time.
local replay = ARGV[1] == '1'
local ttl = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local stored = tonumber(redis.call('HGET', KEYS[i], 'lt'))
  if stored == nil then
    out[#out + 1] = 2
    out[#out + 1] = 0
  else
    local time = lww(stored, tonumber(ARGV[2 + i]), replay)
    if time == nil then
      out[#out + 1] = 0
      out[#out + 1] = stored
    else
      redis.call('HSET', KEYS[i], 'lt', fmt(time), 'terminal', '1')
      redis.call('PEXPIRE', KEYS[i], ttl)
      out[#out + 1] = 1
      out[#out + 1] = time
    end
  end
end
return out
