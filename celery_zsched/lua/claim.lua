-- claim.lua: atomically take a batch of due jobs and mark them queued.
--
-- One script call claims each due occurrence for exactly one caller, however
-- many beat processes run it at once: there is no leader lock. A claimed
-- occurrence waits in the broker under a long *delivery* deadline; only a
-- worker's start (start.lua) turns it into a running execution with a short
-- lease. Backpressure: at most ARGV[3] occurrences may be queued and not yet
-- started; past that, due jobs stay in the schedule instead of the broker.
--
-- KEYS[1] schedule  zset  id -> due ms
-- KEYS[2] queued    zset  id -> delivery deadline ms (published, not started)
-- KEYS[3] leases    zset  id -> execution lease deadline ms (running)
-- KEYS[4] state     hash  id -> runtime state (cjson)
-- KEYS[5] defs      hash  id -> definition JSON
-- KEYS[6] counters  hash  global counters
-- ARGV[1] most jobs to claim
-- ARGV[2] delivery deadline, ms from now
-- ARGV[3] most occurrences queued and not started (backpressure bound)
-- Returns {now_ms, next_due_ms or -1, next_deadline_ms or -1, queued slots left,
--          then per job: id, definition JSON, occurrence, attempt, publishes, due_ms}
local schedule, queued, leases, state, defs, counters =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms()
local deliver_by = now + tonumber(ARGV[2])
local room = tonumber(ARGV[3]) - redis.call("ZCARD", queued)
local limit = math.min(tonumber(ARGV[1]), room)

local out = {now, -1, -1, 0}
local claimed = 0
if limit > 0 then
  local due = redis.call("ZRANGEBYSCORE", schedule, "-inf", now, "WITHSCORES", "LIMIT", 0, limit)
  for i = 1, #due, 2 do
    local id, score = due[i], tonumber(due[i + 1])
    redis.call("ZREM", schedule, id)
    local def = redis.call("HGET", defs, id)
    if def then
      local raw = redis.call("HGET", state, id)
      local st = raw and decode_state(raw) or new_state(score)
      st.x = (st.x or 0) + 1
      st.s, st.due, st.p = "queued", score, now
      redis.call("ZADD", queued, deliver_by, id)
      redis.call("HSET", state, id, encode_state(st))
      claimed = claimed + 1
      out[#out + 1] = id
      out[#out + 1] = def
      out[#out + 1] = st.o
      out[#out + 1] = st.a
      out[#out + 1] = st.x
      out[#out + 1] = score
    else
      redis.call("HDEL", state, id)
    end
  end
end
if claimed > 0 then redis.call("HINCRBY", counters, "promoted", claimed) end
out[4] = math.max(0, room - claimed)
local nd = redis.call("ZRANGE", schedule, 0, 0, "WITHSCORES")
if nd[2] then out[2] = tonumber(nd[2]) end
local nq = redis.call("ZRANGE", queued, 0, 0, "WITHSCORES")
local nl = redis.call("ZRANGE", leases, 0, 0, "WITHSCORES")
if nq[2] then out[3] = tonumber(nq[2]) end
if nl[2] and (out[3] < 0 or tonumber(nl[2]) < out[3]) then out[3] = tonumber(nl[2]) end
return out
