-- Consume a planner pause once; the consumed record stays as the token's tombstone for the TTL.
-- KEYS[1]: the pause (a hash: lt, payload, consumed, consumer, consumed_ms)
-- ARGV: mode, logical time, ttl in ms, grace in ms, consumer key, unanswered keys...
--   mode 'held':  the guard's replay of a consume held for the save of that logical time: takes
--                 the pause only when it is not newer; leaves a tombstone of that time whatever
--                 it finds (unless a newer live save is there)
--   mode 'plain': no idempotency key: take the live pause
--   mode 'keyed': take the live pause for the consumer key (or one consumed within the grace by
--                 an unanswered key); else answer a repeat of the same key within the grace
-- Returns the payload, or false.
local mode = ARGV[1]
local lt = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local grace = tonumber(ARGV[4])
local consumer = ARGV[5]
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'lt', 'payload', 'consumed', 'consumer', 'consumed_ms')
local stored = tonumber(h[1])
local payload = h[2]
local consumed = h[3] == '1'
local live = stored ~= nil and not consumed
local recent = consumed and tonumber(h[5] or '0') > now - grace

local function take(key, time)
  redis.call('HSET', KEYS[1], 'consumed', '1', 'consumer', key, 'consumed_ms', now,
    'lt', fmt(math.max(stored, time)))
  redis.call('PEXPIRE', KEYS[1], ttl)
  return payload
end

if mode == 'held' then
  if live and stored <= lt then return take('', lt) end
  if stored == nil then
    redis.call('HSET', KEYS[1], 'lt', fmt(lt), 'consumed', '1', 'consumer', '', 'consumed_ms', now)
    redis.call('PEXPIRE', KEYS[1], ttl)
  elseif consumed and stored <= lt then
    redis.call('HSET', KEYS[1], 'lt', fmt(lt))
    if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  end
  return false
end
if mode == 'plain' then
  if live then return take('', lt) end
  return false
end
if live then return take(consumer, lt) end
if recent then
  for i = 6, #ARGV do
    if h[4] == ARGV[i] then return take(consumer, lt) end
  end
  if h[4] == consumer and consumer ~= '' then return payload end
end
return false
