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
-- KEYS[13] queue_in_flight  hash  queue -> its occurrences in queued
-- KEYS[14] recrawl_mu  hash  domain -> multiplier of Cho's allocation (the planner's)
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
-- ARGV[21] whether the page changed since the last visit: "1" | "0" | "" (not reported)
-- ARGV[22] content signature the visit saw ("" = none): one that differs from the
--          stored one is a change (when ARGV[21] is "")
-- ARGV[23] ETag the visit saw ("" = keep the stored one)
-- ARGV[24] Last-Modified the visit saw ("" = keep the stored one)
-- ARGV[25] adaptive recrawl JSON {lo, hi: interval bounds ms; x: the target's
--          rate x interval; f: the fixed interval ms; j: jitter ms; a: 1 = Cho's
--          allocation, at the domain's multiplier in KEYS[14] when it has one}
--          ("" = fixed): a regular next run is now + the interval the history
--          calls for + j
-- ARGV[26] ARGV[24] as epoch ms ("" = none, or not an HTTP-date): dates the change
--          a visit saw, for the dated change-rate estimate
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
  local base = domain_base(e, P)
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

-- Cho and Garcia-Molina's change-rate estimate over a decayed history (the
-- Python mirror, with the reasoning, is celery_zsched.core.recrawl).
local DECAY, MAX_UNDATED = 0.95, 0.5
local function visit(changed, modified)
  if st.hl then
    -- The time the visit watched the page unchanged: from the change the page
    -- dated within the gap, else the whole gap (a date outside it says nothing).
    local gap = math.max(0, now - st.hl) / 1000
    local watched, undated = gap, 0
    if changed then
      if modified and modified > st.hl and modified <= now then
        watched = (now - modified) / 1000
      else
        undated = 1
      end
    end
    -- A history from before dates were kept counts its changes undated.
    st.hm = (st.hm or st.ht or 0) * DECAY + watched
    st.hu = (st.hu or st.hx or 0) * DECAY + undated
    st.hv = (st.hv or 0) * DECAY + 1
    st.hx = (st.hx or 0) * DECAY + (changed and 1 or 0)
    st.ht = (st.ht or 0) * DECAY + gap
    if changed then st.hc = now end
  end
  st.hl = now
end

-- Cho's allocation (core.recrawl.allocation_interval_s): the x = rate * interval
-- at which 1 - (1 + x) e^-x, a fetch's marginal freshness, equals mu * rate.
local function allocation_ratio(goal)
  local low, high = 0.0, 60.0
  for _ = 1, 60 do
    local mid = (low + high) / 2
    if 1 - math.exp(-mid) - mid * math.exp(-mid) < goal then low = mid else high = mid end
  end
  return (low + high) / 2
end

local function adaptive_interval(R, mu)
  local n, t = st.hv or 0, st.ht or 0
  if n <= 0 or t <= 0 then return R.f end
  local x = math.min(math.max(st.hx or 0, 0), n)
  local rate
  if st.hm and st.hm > 0 and (st.hu or 0) < MAX_UNDATED then
    rate = x / st.hm  -- every change seen was dated: the dated estimate
  else
    rate = -math.log((n - x + 0.5) / (n + 0.5)) / (t / n)
  end
  if rate <= 0 then return R.hi end
  local ratio = R.x
  if mu then
    if mu * rate >= 1 then return R.hi end  -- too fast to be worth a fetch
    ratio = allocation_ratio(mu * rate)
  end
  return math.floor(math.min(math.max(ratio / rate * 1000, R.lo), R.hi) + 0.5)
end

local opened, home = "", st.fd
if st.fd then
  local name = st.fd
  local domain, flush = domain_cache(KEYS[9], KEYS[10])
  local e, probe = domain_land(domain, st, id)
  local P = pacing_config(ARGV[16])
  if P and outcome ~= "skip" and learn(e, P, probe) then opened = name end
  flush()
end

redis.call("ZREM", leases, id)
queued_rem(queued, KEYS[13], id, st)
schedule_rem(id, schedule, http)

if outcome == "complete" then
  st.r, st.c, st.e = (st.r or 0) + 1, 0, nil
elseif outcome == "error" then
  st.f, st.c, st.e = (st.f or 0) + 1, (st.c or 0) + 1, ARGV[9]
  if label == "error" then st.r = (st.r or 0) + 1 end
end
st.ls, st.l, st.w, st.tk = label, now, nil, nil

-- What the visit saw: the task's word, else a signature unlike the last one. A
-- signature with none stored before only sets the baseline. (ARGV 21-26 may be
-- left out by an older caller: absent is "".)
local seen, sig, etag, modified, recrawl =
  ARGV[21] or "", ARGV[22] or "", ARGV[23] or "", ARGV[24] or "", ARGV[25] or ""
local modified_ms = tonumber(ARGV[26] or "")
local changed = nil
if seen == "1" then changed = true elseif seen == "0" then changed = false end
if sig ~= "" then
  if changed == nil and st.sg then changed = st.sg ~= sig end
  st.sg = sig
end
if etag ~= "" then st.et = etag end
if modified ~= "" then st.lm = modified end
if changed ~= nil then visit(changed, modified_ms) elseif sig ~= "" then st.hl = now end

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
-- An adaptive job's regular next run (not a retry) is now + the interval its
-- history calls for: Redis' clock, this script's compare-and-set.
if due and recrawl ~= "" and label ~= "retrying" then
  local R = decode_json(recrawl)
  local mu = nil
  if R.a == 1 and home then mu = tonumber(redis.call("HGET", KEYS[14], home)) end
  st.ri = adaptive_interval(R, mu)
  due = now + st.ri + R.j
  next_occ = due
  if ARGV[20] ~= "" and due > tonumber(ARGV[20]) then due = nil end
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
