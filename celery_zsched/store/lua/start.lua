-- start.lua: a worker starts an occurrence: compare-and-set queued -> running.
--
-- Exactly one delivery of an occurrence and attempt gets "ok"; any other
-- delivery (a duplicate message, a republished one whose original showed up,
-- a broker redelivery after the run started) finds it running or settled and
-- is dropped without running the task. Only what was promoted starts: the
-- message's delivery number must be one beat published for this attempt
-- (1..publishes), and its task the one it was published under; a message for
-- an occurrence that is only scheduled, or under another task name, is
-- refused and changes nothing. Each start numbers its holder (``k``, only
-- grows): heartbeat, retry and settle must present that number, so a holder
-- whose lease lapsed changes nothing once the occurrence moved on (fencing).
-- The execution lease starts here and the worker's heartbeat keeps it alive
-- (heartbeat.lua).
--
-- KEYS[1] state     hash  id -> runtime state (cjson)
-- KEYS[2] queued    zset  id -> delivery deadline ms
-- KEYS[3] leases    zset  id -> execution lease deadline ms
-- KEYS[4] schedule  zset  id -> due ms
-- KEYS[5] counters  hash  global counters
-- KEYS[6] domains      hash  domain -> learned pacing state (cjson)
-- KEYS[7] domain_conf  hash  domain -> operator overrides (cjson)
-- KEYS[8] http_schedule  zset  id -> due ms of transport "http" jobs (a job made
--                        one while its message waited goes back there)
-- KEYS[9] http_wake      channel  wakes the job gateways
-- KEYS[10] defs     hash  id -> definition JSON (returned with "ok": the settle
--                         computes the next due from it without reading it again)
-- KEYS[11] queue_in_flight  hash  queue -> its occurrences in queued
-- KEYS[12] received  hash  line (line_of) -> latest promotion a first delivery's
--                          start of that line saw: every message of the line published
--                          well before it has left the broker's list (lost.lua)
-- ARGV[1] job id
-- ARGV[2] occurrence
-- ARGV[3] attempt
-- ARGV[4] the message's delivery number ("" = a message from before fencing)
-- ARGV[5] the message's task name ("" = not checked)
-- ARGV[6] execution lease, ms from now
-- ARGV[7] expiry, ms after promotion ("" = never expires)
-- ARGV[8] pacing settings JSON ("" = pacing off)
-- ARGV[9] longest wait for the domain's gate the worker sits out, ms
-- Returns {"ok", now, due_ms, promoted_ms, fence, definition JSON or ""}
--       | {"expired", now, promoted_ms}
--       | {"wait", ms}: the domain's start gate opens in ms; start again then
--       | {"deferred", due_ms}: the gate stays closed longer (Retry-After, an
--         open breaker); the occurrence went back to the schedule, out of flight
--       | {"duplicate", status} | {"stale", status} | {"gone", ""}  (these three count
--         as "duplicates": deliveries that did not run)
--       | {"refused", reason, detail}: never promoted so ("unpromoted", the status),
--         or under another task ("task", the task it was published under);
--         counted as "refused"
local state, queued, leases, schedule, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, occ, attempt = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- Every delivery that does not run is counted: a duplicate, or a refusal.
local function drop(kind, status)
  redis.call("HINCRBY", counters, "duplicates", 1)
  return {kind, status}
end
local function refuse(reason, detail)
  redis.call("HINCRBY", counters, "refused", 1)
  return {"refused", reason, detail}
end
local raw = redis.call("HGET", state, id)
if not raw then return drop("gone", "") end
local st = decode_state(raw)
if st.o ~= occ or st.a ~= attempt then return drop("stale", st.s or "") end
-- "leased" is the queued status of stores written before execution leases
-- existed; "scheduled" with a publish behind it is an occurrence whose message
-- was presumed lost (or whose worker died) and that waits to be republished:
-- the original showed up, so it runs now instead.
if st.s ~= "queued" and st.s ~= "leased" and st.s ~= "scheduled" then
  return drop("duplicate", st.s or "")
end
local P = pacing_config(ARGV[8])
-- A paced occurrence back in the schedule starts only through its next claim,
-- which passes its domain's gate and counts it in flight.
if st.s == "scheduled" and P and st.dm then return drop("duplicate", "scheduled") end
local published = st.x or 0
local delivery = ARGV[4] == "" and published or tonumber(ARGV[4])
if st.s ~= "leased" and (not delivery or delivery < 1 or delivery > published) then
  return refuse("unpromoted", st.s or "")
end
local def = redis.call("HGET", KEYS[10], id)
local task = st.tk
if not task then task = def and decode_json(def).task end
if ARGV[5] ~= "" and task and ARGV[5] ~= task then return refuse("task", task) end
local now = now_ms()
local promoted = st.p or now
if ARGV[7] ~= "" and now > promoted + tonumber(ARGV[7]) then
  return {"expired", now, promoted}
end
-- Claims are spaced at the domain's delay, but messages wait in the broker for
-- different times: the gate is checked again here, on starts, so the requests
-- themselves are spaced (and a gate a 429 closed after the claim holds too).
if P and st.fd then
  local domain, flush = domain_cache(KEYS[6], KEYS[7])
  local e = domain(st.fd)
  local s, delay = e.rec, domain_delay(e, P)
  -- The margin absorbs the worker's own path from this start to its socket,
  -- so the site sees gaps of at least the delay.
  local gate = math.max((s.S or 0) + delay + (P.margin or 0), s.cu or 0)
  local behind_probe = false
  if s.b == "open" and now < (s.bo or 0) then
    gate = math.max(gate, s.bo)
  elseif s.b == "open" then
    s.b, s.pj = "half", nil
  end
  -- Half-open lets exactly one request through: the probe the claim chose, or
  -- this one if none is out. A message claimed before the breaker opened waits.
  if s.b == "half" then
    if s.pj == nil then
      s.pj = id
    elseif s.pj ~= id then
      behind_probe, gate = true, math.max(gate, now + math.max(delay, PACING_RECHECK_MS))
    end
  end
  if gate > now then
    if not behind_probe and gate - now <= tonumber(ARGV[9]) then return {"wait", gate - now} end
    domain_land(domain, st, id)
    local at = domain_reserve(e, gate, delay)
    st.s, st.rv, st.x, st.w = "scheduled", at, math.max(0, (st.x or 1) - 1), nil
    queued_rem(queued, KEYS[11], id, st)
    schedule_add(st, id, at, schedule, KEYS[8], KEYS[9])
    redis.call("HSET", state, id, encode_state(st))
    redis.call("HINCRBY", counters, "deferred", 1)
    flush()
    return {"deferred", at}
  end
  s.S, e.dirty = now, true
  flush()
end
-- Only an occurrence published once marks its line, with that publish's time: a
-- republished message was pushed to the front of the list (celery_zsched.beat.envelope),
-- past messages still waiting, and an original that shows up after a republish
-- was pushed before the promotion time the state now holds.
if st.q and st.p and (delivery or 1) <= 1 and published <= 1 then
  local line = line_of(st)
  if st.p > tonumber(redis.call("HGET", KEYS[12], line) or 0) then
    redis.call("HSET", KEYS[12], line, st.p)
  end
end
queued_rem(queued, KEYS[11], id, st)
redis.call("ZREM", schedule, id)
redis.call("ZADD", leases, now + tonumber(ARGV[6]), id)
st.s, st.sa, st.w, st.k = "running", now, nil, (st.k or 0) + 1
redis.call("HSET", state, id, encode_state(st))
redis.call("HINCRBY", counters, "started", 1)
return {"ok", now, st.due or promoted, promoted, st.k, def or ""}
