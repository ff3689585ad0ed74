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
-- KEYS[9] domains      hash  domain -> learned pacing state (cjson)
-- KEYS[10] domain_conf hash  domain -> operator overrides (cjson)
-- KEYS[11] http_schedule zset id -> due ms of transport "http" jobs
-- KEYS[12] http_wake    channel  wakes the job gateways
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
-- ARGV[14] HTTP status the task reported ("" = none)
-- ARGV[15] Retry-After the task reported, ms ("" = none)
-- ARGV[16] pacing settings JSON ("" = pacing off: only the in-flight count moves)
-- ARGV[17] fence of the execution settling ("" = it never started)
-- ARGV[18] delivery number of the message settling without a start ("" = none)
-- ARGV[19] the Redis time (ms) a next due "now plus a delay" was computed from,
--          estimated by the caller ("" = the next due is absolute, or the time was
--          read from Redis just now): the next due moves on by however much later
--          it is now, so an estimate never makes a run early
-- ARGV[20] end_at of the job, ms ("" = none): a next due past it ends the job
-- Returns {"ok", new status, now, consecutive failures, domain whose breaker this
-- settle opened ("" = none), next due ms (-1 = none)} | {"stale"} | {"changed"}
--       | {"deleted", that domain}
local schedule, leases, state, defs, paused, events, counters, queued =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local http, wake = KEYS[11], KEYS[12]
local id, occ, attempt, outcome, label = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local next_due = ARGV[6]

local raw = redis.call("HGET", state, id)
if not raw then return {"stale"} end
-- A settle may come from the execution that holds the occurrence (its fence),
-- or for an occurrence that never started (expired at start, revoked,
-- rejected, skipped), while it is queued: see holder_of. A zombie, or a report
-- after the reap, finds neither and changes nothing.
local st = decode_state(raw)
if st.o ~= occ or st.a ~= attempt or not holder_of(st, ARGV[17], ARGV[18]) then
  return {"stale"}
end
local deleted = redis.call("HEXISTS", defs, id) == 0
if not deleted and st.g ~= nil and st.g ~= ARGV[10] then return {"changed"} end

local now = now_ms()

-- What the outcome teaches about the domain: a Retry-After closes its gate, a
-- bare 429 multiplies its delay, a success walks the delay back toward the
-- base (AIMD); failures over the window may open the breaker, and the probe's
-- outcome closes or re-opens it.
local function learn(e, P, probe)
  local s, failed = e.rec, outcome == "error"
  local status, retry_after = tonumber(ARGV[14]), tonumber(ARGV[15])
  local base = e.conf.delay or P.delay
  if status == 429 then s.t4, s.t4n = now, (s.t4n or 0) + 1 end
  if retry_after and retry_after > 0 and (status == 429 or status == 503) then
    s.cu = math.max(s.cu or 0, now + retry_after)
  elseif status == 429 and e.conf.adaptive ~= false then
    -- From at least 1 s: doubling a zero delay would never slow anything.
    s.d = math.min(math.max(domain_delay(e, P), 1000) * P.factor, P.max)
  elseif not failed and s.d then
    s.d = s.d - P.dec
    if s.d <= base then s.d = nil end
  end
  if failed then s.tf = (s.tf or 0) + 1 else s.tc = (s.tc or 0) + 1 end
  -- A 429 says the site is up and wants less: the delay and the Retry-After
  -- gate answer it. The breaker is for sites that are down.
  local down = failed and status ~= 429
  if now - (s.w or 0) >= P.window then s.w, s.wo, s.wf = now, 0, 0 end
  if down then s.wf = (s.wf or 0) + 1 elseif status ~= 429 then s.wo = (s.wo or 0) + 1 end
  if probe then
    if down then
      s.b, s.bo = "open", now + P.cool
    else
      s.b, s.bo, s.w, s.wo, s.wf = nil, nil, now, 0, 0
    end
  elseif not s.b then
    local total = s.wo + s.wf
    if total >= P.min and s.wf / total >= P.ratio then
      s.b, s.bo, s.pj = "open", now + P.cool, nil
      -- Only closed -> open is news: a failed probe re-opens a breaker that
      -- never closed, and would otherwise be reported every cooldown.
      return true
    end
  end
  return false
end

local opened = ""
if st.fd then
  local name = st.fd
  local domain, flush = domain_cache(KEYS[9], KEYS[10])
  local e, probe = domain_land(domain, st, id)
  local P = pacing_config(ARGV[16])
  if P and outcome ~= "skip" and learn(e, P, probe) then opened = name end
  flush()
end

redis.call("ZREM", leases, id)
redis.call("ZREM", queued, id)
schedule_rem(id, schedule, http)

if outcome == "complete" then
  st.r, st.c, st.e = (st.r or 0) + 1, 0, nil
elseif outcome == "error" then
  st.f, st.c, st.e = (st.f or 0) + 1, (st.c or 0) + 1, ARGV[9]
  if label == "error" then st.r = (st.r or 0) + 1 end
end
st.ls, st.l, st.w, st.tk = label, now, nil, nil

redis.call("XADD", events, "MAXLEN", "~", ARGV[12], "*",
  "id", id, "occ", ARGV[2], "attempt", ARGV[3], "status", label,
  "error", ARGV[9], "at", now, "data", ARGV[13])
redis.call("HINCRBY", counters, label, 1)

if deleted then
  redis.call("HDEL", state, id)
  return {"deleted", opened}
end

local due, next_occ = tonumber(next_due), tonumber(ARGV[7])
if due and ARGV[19] and ARGV[19] ~= "" then
  local late = math.max(0, now - tonumber(ARGV[19]))
  -- The next occurrence is named by its first due time: it moves with it.
  if ARGV[7] == next_due then next_occ = next_occ + late end
  due = due + late
  if ARGV[20] and ARGV[20] ~= "" and due > tonumber(ARGV[20]) then due = nil end
end
local max_runs = tonumber(ARGV[11])
if not due or (max_runs > 0 and (st.r or 0) >= max_runs) then
  st.s, st.n = "finished", nil
else
  st.o, st.a, st.d, st.x, st.n = next_occ, tonumber(ARGV[8]), 0, 0, due
  if redis.call("SISMEMBER", paused, id) == 1 then
    st.s = "paused"
  else
    st.s = "scheduled"
    schedule_add(st, id, due, schedule, http, wake)
  end
end
redis.call("HSET", state, id, encode_state(st))
return {"ok", st.s, now, st.c or 0, opened, st.n or -1}
