-- Append runtime events to a trace's stream, each once by its fingerprint.
-- KEYS[1]: the stream (fields: ts, d); KEYS[2]: the set of fingerprints
-- ARGV: ttl in ms, then per event: fingerprint, ts, doc JSON
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'ts', ARGV[i + 1], 'd', ARGV[i + 2])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
