-- _prelude.lua: prepended to every script when it is loaded (scripts.py).
--
-- It holds what every script shares: the Redis clock and the runtime state's
-- encoding. The state is a compact JSON object whose one- and two-letter keys
-- are documented, with their Python names and types, in one place:
-- celery_zsched.state.RuntimeState (keep the two in step).
--
-- Redis' clock in epoch ms: the only clock due times, leases and lateness use.
local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The state of an occurrence that has not run yet: attempt 1, no counts.
local function new_state(occurrence)
  return {o = occurrence, a = 1, d = 0, r = 0, f = 0, c = 0}
end

local function decode_state(raw)
  return cjson.decode(raw)
end

local function encode_state(st)
  return cjson.encode(st)
end

-- The state of job ``id`` if its current occurrence and attempt are the ones
-- given (ARGV strings) and its status is one of ``statuses``; else nil. Every
-- compare-and-set on an occurrence starts here.
local function current_state(key, id, occurrence, attempt, statuses)
  local raw = redis.call("HGET", key, id)
  if not raw then return nil end
  local st = decode_state(raw)
  if st.o ~= tonumber(occurrence) or st.a ~= tonumber(attempt) then return nil end
  for _, status in ipairs(statuses) do
    if st.s == status then return st end
  end
  return nil
end
