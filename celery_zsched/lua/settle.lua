-- settle.lua: apply a task's outcome, compare-and-set on occurrence and attempt.
--
-- A settle whose occurrence or attempt is not the job's current one (late,
-- duplicate, or for a deleted job) changes nothing, so the schedule never moves
-- backwards or forks. A settle for a deleted job does not bring it back; one
-- for a paused job records the outcome but does not reschedule.
--
-- KEYS[1] schedule  zset   id -> due ms
-- KEYS[2] leases    zset   id -> execution lease deadline ms
-- KEYS[3] state     hash   id -> runtime state (cjson)
-- KEYS[4] defs      hash   id -> definition JSON
-- KEYS[5] paused    set    paused ids
-- KEYS[6] events    stream settle events
-- KEYS[7] counters  hash   global counters
-- KEYS[8] queued    zset   id -> delivery deadline ms
-- ARGV[1]  job id
-- ARGV[2]  occurrence being settled
-- ARGV[3]  attempt being settled
-- ARGV[4]  outcome: complete | error | skip
-- ARGV[5]  status label: complete | retrying | error | skipped
-- ARGV[6]  next due ms ("" ends the job)
-- ARGV[7]  next occurrence
-- ARGV[8]  next attempt
-- ARGV[9]  error text ("" for none)
-- ARGV[10] timing signature the caller computed the next due from
-- ARGV[11] max_runs (0 = unlimited)
-- ARGV[12] approximate cap of the events stream
-- ARGV[13] event payload JSON (task id, timings)
-- Returns {"ok", new status, now} | {"stale"} | {"changed"} | {"deleted"}
local schedule, leases, state, defs, paused, events, counters, queued =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local id, occ, attempt, outcome, label = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local next_due = ARGV[6]

local raw = redis.call("HGET", state, id)
if not raw then return {"stale"} end
-- A settle may come from a worker (running) or for an occurrence that never
-- started (expired at start, revoked, rejected): both are current while queued.
local st = decode_state(raw)
if st.o ~= occ or st.a ~= attempt or st.s == "finished" or st.s == "dead" then
  return {"stale"}
end
local deleted = redis.call("HEXISTS", defs, id) == 0
if not deleted and st.g ~= nil and st.g ~= ARGV[10] then return {"changed"} end

local now = now_ms()
redis.call("ZREM", leases, id)
redis.call("ZREM", queued, id)
redis.call("ZREM", schedule, id)

if outcome == "complete" then
  st.r, st.c, st.e = (st.r or 0) + 1, 0, nil
elseif outcome == "error" then
  st.f, st.c, st.e = (st.f or 0) + 1, (st.c or 0) + 1, ARGV[9]
  if label == "error" then st.r = (st.r or 0) + 1 end
end
st.ls, st.l = label, now

redis.call("XADD", events, "MAXLEN", "~", ARGV[12], "*",
  "id", id, "occ", ARGV[2], "attempt", ARGV[3], "status", label,
  "error", ARGV[9], "at", now, "data", ARGV[13])
redis.call("HINCRBY", counters, label, 1)

if deleted then
  redis.call("HDEL", state, id)
  return {"deleted"}
end

local max_runs = tonumber(ARGV[11])
if next_due == "" or (max_runs > 0 and (st.r or 0) >= max_runs) then
  st.s, st.n = "finished", nil
else
  st.o, st.a, st.d, st.x, st.n = tonumber(ARGV[7]), tonumber(ARGV[8]), 0, 0, tonumber(next_due)
  if redis.call("SISMEMBER", paused, id) == 1 then
    st.s = "paused"
  else
    st.s = "scheduled"
    redis.call("ZADD", schedule, next_due, id)
  end
end
redis.call("HSET", state, id, encode_state(st))
return {"ok", st.s, now}
