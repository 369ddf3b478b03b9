-- Shared by every script of the Redis store (prepended when the script is loaded).
-- Logical times are integers below 2^53: exact in Lua's doubles; written with '%.0f' (never '1e+15').
local function fmt(n) return string.format('%.0f', n) end

-- The last-write-wins rule (guarded.backend): the time a write of logical time `lt` leaves on a
-- record holding `stored` (nil: no record), or nil when the write is a replay older than `stored`.
-- A direct write is always applied and the record's time only grows.
local function lww(stored, lt, replay)
  if stored == nil then return lt end
  if replay then
    if lt < stored then return nil end
    return lt
  end
  if lt <= stored then return stored + 1 end
  return lt
end

-- The server's clock in milliseconds (scripts replicate their effects, so TIME is allowed).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
