-- reap.lua: return jobs whose lease ended with no settle to the schedule.
--
-- The same occurrence and attempt become due again at their original due
-- time, so the redelivery carries the same deterministic task id. A job
-- already delivered max_deliveries times is dead-lettered instead.
--
-- KEYS[1] leases    zset  id -> lease deadline ms
-- KEYS[2] schedule  zset  id -> due ms
-- KEYS[3] state     hash  id -> runtime state (cjson)
-- KEYS[4] dead      zset  id -> time of death ms
-- KEYS[5] defs      hash  id -> definition JSON
-- KEYS[6] counters  hash  global counters
-- ARGV[1] most leases to reap
-- ARGV[2] max deliveries of one occurrence
-- Returns {redelivered, dead-lettered, then the ids reaped}
local leases, schedule, state, dead, defs, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_deliveries = tonumber(ARGV[2])

local expired = redis.call("ZRANGEBYSCORE", leases, "-inf", now, "LIMIT", 0, tonumber(ARGV[1]))
local out = {0, 0}
for _, id in ipairs(expired) do
  redis.call("ZREM", leases, id)
  local raw = redis.call("HGET", state, id)
  if raw and redis.call("HEXISTS", defs, id) == 1 then
    local st = cjson.decode(raw)
    if (st.d or 0) >= max_deliveries then
      st.s = "dead"
      redis.call("ZADD", dead, now, id)
      out[2] = out[2] + 1
    else
      st.s = "scheduled"
      redis.call("ZADD", schedule, st.due or now, id)
      out[1] = out[1] + 1
    end
    redis.call("HSET", state, id, cjson.encode(st))
    out[#out + 1] = id
  else
    redis.call("HDEL", state, id)
  end
end
if out[1] > 0 then redis.call("HINCRBY", counters, "redelivered", out[1]) end
if out[2] > 0 then redis.call("HINCRBY", counters, "dead", out[2]) end
return out
