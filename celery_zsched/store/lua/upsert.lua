-- upsert.lua: store job definitions; add a schedule entry only when it is absent.
--
-- Re-storing an unchanged definition never moves its schedule (ZADD NX
-- semantics). A changed timing signature moves the schedule of a job that is
-- not in flight; an in-flight job picks up the change when it settles.
-- Each created job, and each job whose definition or paused state changed, is
-- recorded in the audit stream (an unchanged job records nothing).
-- A row with a version (the Django outbox) is written only if no newer version
-- of the job is stored, nor a newer delete's tombstone (see _prelude.lua):
-- pushes that arrive out of order, and retries, never move a definition back.
--
-- KEYS[1] defs      hash  id -> definition JSON
-- KEYS[2] schedule  zset  id -> due ms
-- KEYS[3] leases    zset  id -> execution lease deadline ms
-- KEYS[4] state     hash  id -> runtime state (cjson)
-- KEYS[5] paused    set   paused ids
-- KEYS[6] static    set   ids that come from beat_schedule
-- KEYS[7] queued    zset  id -> delivery deadline ms
-- KEYS[8] audit     stream  changes to jobs (capped)
-- KEYS[9] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[10] http_wake     channel  wakes the job gateways
-- KEYS[11] tombstones        hash  id -> version of its delete
-- KEYS[12] tombstone_expiry  zset  id -> when its tombstone expires (ms)
-- ARGV[1] "1" to mark every job as static, else "0"
-- ARGV[2] audit stream cap (0: record nothing)
-- ARGV[3] actor kind
-- ARGV[4] actor name
-- ARGV[5] note ("" = none)
-- ARGV[6..] groups of 10: id, definition JSON, first due ms ("" = none),
--           enabled ("1"/"0"), timing signature, least ms from the job's last
--           run to a rescheduled run ("" = no floor; interval jobs: interval +
--           jitter, so an edit or a resume never makes a job run early), the
--           domain it is paced under ("" = not paced), and its transport
--           ("h" = http, "" = celery), and what must hold for the row to be
--           written ("" = nothing; "absent" = no definition yet; else the
--           SHA-1 of the definition it replaces): the REST API's create and
--           compare-and-set edit. A row that fails it is skipped and counted.
--           Last, the row's version ("" = none): a row older than the stored
--           version is not written, and counted as stale.
-- Returns {created, updated, rescheduled, skipped, stale}
local defs, schedule, leases, state, paused, static, queued, http, wake =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[9], KEYS[10]
local mark_static = ARGV[1] == "1"
local A = audit_from(KEYS[8], 2)
local T = tombstones_of(KEYS[11], KEYS[12])
local created, updated, rescheduled, skipped, stale = 0, 0, 0, 0, 0

local function expected(id, expect)
  if expect == "" then return true end
  local old = redis.call("HGET", defs, id)
  if expect == "absent" then return not old end
  return old and redis.sha1hex(old) == expect
end

for i = 6, #ARGV, 10 do
  local id, def, due, enabled, sig = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3] == "1", ARGV[i + 4]
  local gap, dm, transport, version = ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], tonumber(ARGV[i + 9])
  local raw = redis.call("HGET", state, id)
  local st = raw and decode_state(raw) or nil
  if not expected(id, ARGV[i + 8]) then
    skipped = skipped + 1
  elseif version_refused(T, id, version, st) then
    stale = stale + 1
  else
    if A.maxlen > 0 then
      -- Before the write: the diff is against the definition this one replaces.
      local old = redis.call("HGET", defs, id)
      if not old then
        audit_add(A, id, "create", "def", def)
      else
        -- The paused set is the record of "enabled" (the definition keeps the
        -- value it was last written with): "was" is the value it replaces.
        local was_enabled = redis.call("SISMEMBER", paused, id) == 0
        if old ~= def or was_enabled ~= enabled then
          audit_add(A, id, "edit", "old", old, "new", def, "was", was_enabled and "1" or "0")
        end
      end
    end
    local is_new = redis.call("HSET", defs, id, def) == 1
    if mark_static then redis.call("SADD", static, id) end
    if not raw then
      created = created + 1
      st = new_state(tonumber(due) or 0)
      st.g, st.s = sig, "scheduled"
      if transport ~= "" then st.t = transport end
      if due == "" then
        st.s = "finished"
      elseif enabled then
        schedule_add(st, id, due, schedule, http, wake)
      else
        st.s = "paused"
        redis.call("SADD", paused, id)
      end
    else
      -- A state without a definition is an occurrence still in flight after a
      -- delete: the job is created again and continues from that occurrence.
      if is_new then created = created + 1 else updated = updated + 1 end
      local in_flight = redis.call("ZSCORE", leases, id) or redis.call("ZSCORE", queued, id)
      -- A change of transport moves a waiting job to the other schedule at the
      -- same due time; one in flight lands in the new one when it settles.
      if (st.t or "") ~= transport then
        local at = schedule_score(id, schedule, http)
        schedule_rem(id, schedule, http)
        st.t = transport ~= "" and transport or nil
        if at then schedule_add(st, id, at, schedule, http, wake) end
      end
      if not enabled then
        redis.call("SADD", paused, id)
        if schedule_rem(id, schedule, http) == 1 or st.s == "scheduled" then st.s = "paused" end
      else
        local was_paused = redis.call("SREM", paused, id) == 1
        local move = (st.g ~= sig and st.s ~= "dead") or (was_paused and st.s == "paused")
        if move and not in_flight then
          rescheduled = rescheduled + 1
          if due == "" then
            schedule_rem(id, schedule, http)
            st.s = "finished"
          else
            local at = tonumber(due)
            if gap ~= "" and st.l then at = math.max(at, st.l + tonumber(gap)) end
            schedule_add(st, id, at, schedule, http, wake)
            st.o, st.a, st.d, st.x, st.s = at, 1, 0, 0, "scheduled"
          end
        end
      end
      st.g = sig
    end
    -- The claim paces by this; an occurrence in flight keeps its own (fd) until it lands.
    if dm ~= "" then st.dm = dm else st.dm = nil end
    version_applied(T, id, version, st)
    redis.call("HSET", state, id, encode_state(st))
  end
end
return {created, updated, rescheduled, skipped, stale}
