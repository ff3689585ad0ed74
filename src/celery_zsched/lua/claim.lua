-- claim.lua: atomically take a batch of due jobs and lease them.
--
-- One script call claims each due occurrence for exactly one caller, however
-- many beat processes run it at once: there is no leader lock.
--
-- KEYS[1] schedule  zset  id -> due ms
-- KEYS[2] leases    zset  id -> lease deadline ms
-- KEYS[3] state     hash  id -> runtime state (cjson)
-- KEYS[4] defs      hash  id -> definition JSON
-- KEYS[5] counters  hash  global counters
-- ARGV[1] most jobs to claim
-- ARGV[2] lease length, ms
-- Returns {now_ms, next_due_ms or -1, next_lease_deadline_ms or -1,
--          then per job: id, definition JSON, occurrence, attempt, deliveries, due_ms}
local schedule, leases, state, defs, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now + tonumber(ARGV[2])

local due = redis.call("ZRANGEBYSCORE", schedule, "-inf", now, "WITHSCORES", "LIMIT", 0, tonumber(ARGV[1]))
local out = {now, -1, -1}
local claimed = 0
for i = 1, #due, 2 do
  local id, score = due[i], tonumber(due[i + 1])
  redis.call("ZREM", schedule, id)
  local def = redis.call("HGET", defs, id)
  if def then
    local raw = redis.call("HGET", state, id)
    local st = raw and cjson.decode(raw) or {o = score, a = 1, d = 0, r = 0, f = 0, c = 0}
    st.d = (st.d or 0) + 1
    st.s, st.due, st.p = "leased", score, now
    redis.call("ZADD", leases, lease_until, id)
    redis.call("HSET", state, id, cjson.encode(st))
    claimed = claimed + 1
    out[#out + 1] = id
    out[#out + 1] = def
    out[#out + 1] = st.o
    out[#out + 1] = st.a
    out[#out + 1] = st.d
    out[#out + 1] = score
  else
    redis.call("HDEL", state, id)
  end
end
if claimed > 0 then redis.call("HINCRBY", counters, "promoted", claimed) end
local nd = redis.call("ZRANGE", schedule, 0, 0, "WITHSCORES")
if nd[2] then out[2] = tonumber(nd[2]) end
local nl = redis.call("ZRANGE", leases, 0, 0, "WITHSCORES")
if nl[2] then out[3] = tonumber(nl[2]) end
return out
