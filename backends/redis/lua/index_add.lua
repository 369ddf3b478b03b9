-- Add members to a sorted-set index and keep the index alive for its key class's TTL.
-- KEYS[1]: the index
-- ARGV: ttl in ms, 'nx' (keep a member's score) or 'xx-any' (set it), then score, member pairs
local nx = ARGV[2] == 'nx'
for i = 3, #ARGV, 2 do
  if nx then
    redis.call('ZADD', KEYS[1], 'NX', ARGV[i], ARGV[i + 1])
  else
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
