-- An artifact put again (same content, same namespace): refresh its TTL and return its ref.
-- KEYS[1]: the artifact (a hash: ref, data, size, session, trace)
-- ARGV: ttl in ms
-- Returns the ref JSON, or false when the artifact is not stored.
local ref = redis.call('HGET', KEYS[1], 'ref')
if not ref then return false end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return ref
