-- Append planner events to a trace's stream; an event with a call key is appended once.
-- KEYS[1]: the stream (field: d); KEYS[2]: the set of call keys
-- ARGV: ttl in ms, then per event: call key ('' none), doc JSON
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  if ARGV[i] == '' then
    redis.call('XADD', KEYS[1], '*', 'd', ARGV[i + 1])
  elseif redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'd', ARGV[i + 1])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
