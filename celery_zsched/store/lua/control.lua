-- control.lua: pause, resume, run-now or delete many jobs in one call.
--
-- None of these touches an occurrence that is in flight: pausing or deleting
-- only changes what happens after its settle, and run-now skips it. Deleting
-- an in-flight job keeps its lease and state until its settle (which records
-- the outcome, then forgets the job) or until reap drops the expired lease.
-- A row with a version (the Django outbox: pause, resume, delete) acts only if
-- no newer version of the job is stored (see _prelude.lua); a versioned delete
-- leaves a tombstone of its version, also for a job Redis never had, so an
-- older upsert that arrives late cannot bring the job back.
--
-- KEYS[1] defs      hash  id -> definition JSON
-- KEYS[2] schedule  zset  id -> due ms
-- KEYS[3] leases    zset  id -> execution lease deadline ms
-- KEYS[4] state     hash  id -> runtime state (cjson)
-- KEYS[5] paused    set   paused ids
-- KEYS[6] dead      zset  dead-lettered ids
-- KEYS[7] static    set   ids from beat_schedule
-- KEYS[8] queued    zset  id -> delivery deadline ms
-- KEYS[9] audit     stream  changes to jobs (capped): one entry per job changed
-- KEYS[10] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[11] http_wake     channel  wakes the job gateways
-- KEYS[12] tombstones        hash  id -> version of its delete
-- KEYS[13] tombstone_expiry  zset  id -> when its tombstone expires (ms)
-- ARGV[1] operation: pause | resume | run_now | delete | reset | requeue | purge
--   requeue and purge act on dead letters only (ids in the dead set): a job
--   another operator requeued or resumed a moment ago is left as it is.
--   requeue: unpaused and due now, crash, attempt and failure streak counters
--   reset (all-time failures and the last error are kept as history);
--   purge: the dead letter is dropped and the job kept, paused.
-- ARGV[2] audit stream cap (0: record nothing)
-- ARGV[3] actor kind
-- ARGV[4] actor name
-- ARGV[5] note ("" = none)
-- ARGV[6] tombstone ttl ms (how long a versioned delete's tombstone is kept)
-- ARGV[7..] groups of 3: id, due ms (resume: the next run, "" once the job has
--           ended; others ignore it), version ("" = none; a row older than the
--           stored version is left alone and counted as stale)
-- Returns {changed, stale, then the ids that were not found}
local defs, schedule, leases, state, paused, dead, static, queued, http, wake =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[10], KEYS[11]
local op = ARGV[1]
local A = audit_from(KEYS[9], 2)
local T = tombstones_of(KEYS[12], KEYS[13])
local ttl = tonumber(ARGV[6])
local now = now_ms()
local out = {0, 0}
-- Pause and resume as a diff of the definition's ``enabled`` (see audit.py).
local PAUSED, RESUMED = '{"enabled":[true,false]}', '{"enabled":[false,true]}'

for i = 7, #ARGV, 3 do
  local id, version = ARGV[i], tonumber(ARGV[i + 2])
  local raw = redis.call("HGET", state, id)
  local stored = raw and decode_state(raw) or nil
  if version_refused(T, id, version, stored) then
    out[2] = out[2] + 1
  elseif redis.call("HEXISTS", defs, id) == 0 then
    if op == "delete" and version then tombstone_add(T, id, version, ttl) end
    out[#out + 1] = id
  else
    local st = stored or new_state(now)
    local in_flight = redis.call("ZSCORE", leases, id) or redis.call("ZSCORE", queued, id)
    local changed = false
    -- What the audit entry says besides the action: a diff, or the deleted definition.
    local what, value = nil, nil
    if op == "delete" then
      what, value = "def", redis.call("HGET", defs, id)
      redis.call("HDEL", defs, id)
      if not in_flight then redis.call("HDEL", state, id) end
      schedule_rem(id, schedule, http)
      redis.call("SREM", paused, id)
      redis.call("ZREM", dead, id)
      redis.call("SREM", static, id)
      changed, st = true, nil
    elseif op == "pause" then
      changed = redis.call("SADD", paused, id) == 1
      if schedule_rem(id, schedule, http) == 1 then st.s = "paused" end
      what, value = "diff", PAUSED
    elseif op == "resume" then
      changed = redis.call("SREM", paused, id) == 1
      if changed then what, value = "diff", RESUMED end
      if not in_flight and (st.s == "paused" or st.s == "dead")
          and not schedule_score(id, schedule, http) then
        redis.call("ZREM", dead, id)
        if ARGV[i + 1] == "" then
          st.s = "finished"
        else
          schedule_add(st, id, ARGV[i + 1], schedule, http, wake)
          st.o, st.a, st.d, st.x, st.s = tonumber(ARGV[i + 1]), 1, 0, 0, "scheduled"
        end
        changed = true
      end
    elseif op == "run_now" then
      if not in_flight then
        redis.call("ZREM", dead, id)
        schedule_add(st, id, now, schedule, http, wake)
        st.o, st.a, st.d, st.x, st.s = now, 1, 0, 0, "scheduled"
        changed = true
      end
    elseif op == "reset" then
      st.c, st.f, st.e = 0, 0, nil
      if st.s == "dead" and not in_flight then
        redis.call("ZREM", dead, id)
        if redis.call("SISMEMBER", paused, id) == 1 then
          st.s = "paused"
        else
          schedule_add(st, id, now, schedule, http, wake)
          st.o, st.a, st.d, st.x, st.s = now, 1, 0, 0, "scheduled"
        end
      end
      changed = true
    elseif op == "requeue" or op == "purge" then
      if not in_flight and redis.call("ZREM", dead, id) == 1 then
        st.d, st.a, st.x, st.c = 0, 1, 0, 0
        if op == "requeue" then
          schedule_add(st, id, now, schedule, http, wake)
          st.o, st.s = now, "scheduled"
          if redis.call("SREM", paused, id) == 1 then what, value = "diff", RESUMED end
        else
          if redis.call("SADD", paused, id) == 1 then what, value = "diff", PAUSED end
          schedule_rem(id, schedule, http)
          st.s = "paused"
        end
        changed = true
      end
    else
      return redis.error_reply("unknown operation " .. op)
    end
    if op == "delete" and version then
      tombstone_add(T, id, version, ttl)
    else
      version_applied(T, id, version, st)
    end
    if st then redis.call("HSET", state, id, encode_state(st)) end
    if changed then
      out[1] = out[1] + 1
      audit_add(A, id, op, what, value)
    end
  end
end
if op == "delete" then tombstones_prune(T) end
return out
