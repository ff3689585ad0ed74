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

-- Fencing: whether a caller speaking for (``fence``, ``delivery``), ARGV strings,
-- holds occurrence state ``st`` (whose occurrence and attempt already matched).
--   fence given: the execution that a start (or the gateway's claim) numbered
--     so, still running. A holder whose lease lapsed, and whose occurrence was
--     reaped or handed out again, holds nothing: it can neither extend, retry
--     nor settle.
--   else delivery given: an occurrence that never started (expired at start,
--     revoked, rejected, a misfire skip), still queued, named by a message
--     that was published: 1 <= delivery <= publishes.
--   neither: an unfenced caller (tests and tools): queued or running.
local function holder_of(st, fence, delivery)
  if fence and fence ~= "" then return st.s == "running" and (st.k or 0) == tonumber(fence) end
  local waiting = st.s == "queued" or st.s == "leased"
  if delivery and delivery ~= "" then
    local n = tonumber(delivery)
    return waiting and n ~= nil and n >= 1 and n <= (st.x or 0)
  end
  return waiting or st.s == "running"
end

-- Per-domain pacing (celery_zsched.domains; README "Politeness"). The hash
-- ``domains`` holds each domain's learned state, ``domain_conf`` the operator's
-- overrides ({delay = ms, cap = n, adaptive = bool}). A state's keys:
--   L   last grant by a claim (ms)         S   last start by a worker (ms)
--   R   next free slot for a held job      n   occurrences in flight
--   d   adaptive delay (ms; nil = base)    cu  gate closed until (Retry-After)
--   b   breaker: "open" | "half" | nil     bo  breaker open until
--   pj  id of the half-open probe          w, wo, wf  window start, completed, failed
--   tc, tf  completed, failed (totals)     t4, t4n  last 429, 429s seen
--   h   times a job was held back         rd  robots.txt Crawl-delay (ms)
-- An occurrence in flight names its domain in its own state (``fd``), so it
-- leaves flight exactly once whichever path ends it (settle, reap, release).

-- JSON that is not a job's state (domain records, overrides, settings).
local function decode_json(raw) return cjson.decode(raw) end
local function encode_json(value) return cjson.encode(value) end
local function is_json_null(value) return value == cjson.null end

-- A domain at its cap, or behind a half-open probe, is looked at again after
-- its delay and at least this long: nothing says when a slot frees, and a zero
-- delay must not spin.
local PACING_RECHECK_MS = 1000

-- The pacing settings (the ARGV JSON of PacingDefaults), or nil: pacing off.
local function pacing_config(raw)
  if raw == nil or raw == "" then return nil end
  return cjson.decode(raw)
end

-- Lua's C stack holds about 8000 values: HMGET and HSET go in chunks.
local CHUNK = 4000

-- HMGET of ``fields`` (a list), as a list aligned with it.
local function hmget_all(key, fields)
  local out = {}
  for first = 1, #fields, CHUNK do
    local part = redis.call("HMGET", key, unpack(fields, first, math.min(#fields, first + CHUNK - 1)))
    for i = 1, #part do out[first + i - 1] = part[i] end
  end
  return out
end

-- get(name) -> entry {rec, conf, dirty} read once per script call; preload(names)
-- reads many with one HMGET; flush() writes back the entries that changed, in
-- one HSET.
local function domain_cache(state_key, conf_key)
  local cache = {}
  -- Most fleets set no override: one HLEN per call saves a read per domain.
  local overrides = nil
  local function has_overrides()
    if overrides == nil then
      overrides = conf_key ~= nil and redis.call("HLEN", conf_key) > 0
    end
    return overrides
  end
  local function entry(name, rs, rc)
    local e = {rec = rs and cjson.decode(rs) or {}, conf = rc and cjson.decode(rc) or {}, dirty = false}
    cache[name] = e
    return e
  end
  local function get(name)
    return cache[name] or entry(name, redis.call("HGET", state_key, name),
                                has_overrides() and redis.call("HGET", conf_key, name))
  end
  local function preload(names)
    if #names == 0 then return end
    local states = hmget_all(state_key, names)
    local confs = has_overrides() and hmget_all(conf_key, names) or {}
    for i, name in ipairs(names) do entry(name, states[i], confs[i]) end
  end
  local function flush()
    local args = {}
    for name, e in pairs(cache) do
      if e.dirty then
        args[#args + 1] = name
        args[#args + 1] = cjson.encode(e.rec)
      end
    end
    for first = 1, #args, CHUNK do
      redis.call("HSET", state_key, unpack(args, first, math.min(#args, first + CHUNK - 1)))
    end
  end
  return get, flush, preload
end

-- The configured delay (ms): the operator's override wins; else the default,
-- raised to the Crawl-delay of the domain's robots.txt (``rd``, written by the
-- worker's robots check) while zsched_robots is on.
local function domain_base(e, P)
  if e.conf.delay then return e.conf.delay end
  if P.robots and e.rec.rd then return math.max(P.delay, e.rec.rd) end
  return P.delay
end

-- The delay in force (ms): the base, raised by the adaptive delay unless the
-- domain's override turned adaptation off.
local function domain_delay(e, P)
  local base = domain_base(e, P)
  if e.conf.adaptive == false then return base end
  return math.max(base, e.rec.d or 0)
end

-- A held job takes the next free slot at or after ``at``: jobs of one domain
-- that are held together are spread at its delay, not retried in a loop.
local function domain_reserve(e, at, delay)
  local t = math.max(at, e.rec.R or 0)
  e.rec.R = t + delay
  e.rec.h = (e.rec.h or 0) + 1
  e.dirty = true
  return t
end

-- Occurrence ``id`` (state ``st``) leaves flight. Returns its domain's entry
-- (nil when it was not paced) and whether it was the half-open probe; a probe
-- that leaves without a verdict frees the way for the next one.
local function domain_land(get, st, id)
  local name = st.fd
  if not name then return nil, false end
  st.fd = nil
  local e = get(name)
  e.rec.n = math.max(0, (e.rec.n or 0) - 1)
  local probe = e.rec.pj == id
  if probe then e.rec.pj = nil end
  e.dirty = true
  return e, probe
end

-- HTTP jobs (transport "http": state ``t = "h"``) wait in a schedule of their
-- own, which beat's claim never reads; only the job gateway claims from it.
-- Every script that puts a job back in a schedule goes through schedule_add,
-- so reap, settle, release and the controls treat both kinds alike.
local function schedule_of(st, beat, http)
  if st.t == "h" then return http end
  return beat
end

-- Put job ``id`` (state ``st``) in its schedule at ``due``. An HTTP job that
-- falls due before every job the gateways sleep towards (the first one in the
-- future) wakes them on ``wake``: they sleep until that time, not in a loop.
local function schedule_add(st, id, due, beat, http, wake)
  due = tonumber(due)
  if st.t ~= "h" then
    redis.call("ZADD", beat, due, id)
    return
  end
  local first = redis.call("ZRANGEBYSCORE", http, "(" .. now_ms(), "+inf", "WITHSCORES", "LIMIT", 0, 1)
  redis.call("ZADD", http, due, id)
  if not first[2] or due <= tonumber(first[2]) then redis.call("PUBLISH", wake, due) end
end

-- Take job ``id`` out of whichever schedule holds it; 1 if one did.
local function schedule_rem(id, beat, http)
  return redis.call("ZREM", beat, id) + redis.call("ZREM", http, id)
end

-- The due time of job ``id`` in either schedule, or nil.
local function schedule_score(id, beat, http)
  return redis.call("ZSCORE", beat, id) or redis.call("ZSCORE", http, id)
end

-- ------------------------------------------------- per-queue backpressure
-- Each occurrence in ``queued`` that a claim counted names its queue in its
-- state (``bq``), and ``counts`` (the queue_in_flight hash) holds how many
-- each queue has there. Every script adds to or takes from ``queued`` through
-- these two, which change a count only when the membership changes, so the
-- counts follow the set whichever path (start, settle, reap, rescue, release,
-- retry) moves an occurrence. One queued before counts existed has no ``bq``
-- and counts nowhere.
local function queued_add(queued, counts, id, at, st, q)
  if redis.call("ZADD", queued, at, id) == 1 and q then
    st.bq = q
    redis.call("HINCRBY", counts, q, 1)
  end
end

-- Take ``id`` (state ``st``, may be nil) out of ``queued``; 1 if it was there.
local function queued_rem(queued, counts, id, st)
  local n = redis.call("ZREM", queued, id)
  if n == 1 and counts and st and st.bq then
    if redis.call("HINCRBY", counts, st.bq, -1) <= 0 then redis.call("HDEL", counts, st.bq) end
  end
  return n
end

-- Back to the schedule at its due time, same occurrence and attempt, out of its
-- domain's flight: nothing will start its message (its worker or beat died, or the
-- message was lost), so the next claim publishes it again with the same task id.
-- The caller takes it out of queued or leases, and writes the state.
local function due_again(st, id, domain, schedule, http, wake)
  st.s = "scheduled"
  domain_land(domain, st, id)
  schedule_add(st, id, st.due or now_ms(), schedule, http, wake)
end

-- The broker list a confirmed message waits in: its queue, and its priority
-- (kombu's Redis transport keeps one list per priority). Messages of one line
-- leave it in the order they were pushed (LPUSH, BRPOP): the start that records
-- a line's progress (start.lua) and the sweep of lost messages (lost.lua) name
-- lines so; celery_zsched.store.hot.line_of is the same on the Python side.
local function line_of(st)
  return st.q .. "\31" .. (st.pr and string.format("%d", st.pr) or "")
end

-- A job the claim held back because its queue was at its bound stays in the
-- schedule, scored PARK_BASE + its due time: past every real due time (run_at
-- stops at year 9999, 2.5e14 ms), so the claim's due range and the next due
-- time beat sleeps towards are the other queues', and the held keep their due
-- order. Scores are doubles: PARK_BASE plus a due time stays an exact integer.
local PARK_BASE = 1125899906842624  -- 2^50

-- ------------------------------------------------------------ audit trail
-- One entry of a partition's capped audit stream (fields: see
-- celery_zsched/audit.py). ``A`` holds the stream key, its cap (0: record
-- nothing), the actor's kind and name and the note; ``...`` are more field,
-- value pairs (the diff, or the definitions). Diffs are worked out by the
-- reader, from the definitions: Lua only compares strings.
local function audit_add(A, id, action, ...)
  if A.maxlen <= 0 then return end
  local f = {"id", id, "action", action, "kind", A.kind, "by", A.by}
  if A.note ~= "" then f[#f + 1], f[#f + 2] = "note", A.note end
  for _, v in ipairs({...}) do f[#f + 1] = v end
  redis.call("XADD", A.stream, "MAXLEN", "~", A.maxlen, "*", unpack(f))
end

-- The audit ARGV of a mutating script, starting at ARGV[first]:
-- maxlen, actor kind, actor name, note.
local function audit_from(stream, first)
  return {stream = stream, maxlen = tonumber(ARGV[first]) or 0, kind = ARGV[first + 1],
          by = ARGV[first + 2], note = ARGV[first + 3]}
end

-- ------------------------------------------------------- versioned writes
-- A write that carries a version (the Django outbox: README "Django") applies
-- unless a newer version is stored: the job's own (state ``v``), or the
-- tombstone its delete left (hash ``tombstones``, until its time in the sorted
-- set ``tombstone_expiry``, on Redis' clock). The same version again is a replay
-- of the same change: it applies, and changes nothing. An unversioned write
-- (``version`` nil: the CLI, the REST API's store writer, beat_schedule) always
-- applies and leaves the versions alone. ``T`` holds the two tombstone keys.
local function tombstones_of(tombs, expiry)
  return {tombs = tombs, expiry = expiry, now = nil}
end

local function tombstone_now(T)
  if not T.now then T.now = now_ms() end
  return T.now
end

-- Whether a write of ``version`` to job ``id`` (state ``st`` or nil) is older
-- than what is stored. A tombstone found expired is dropped on the way.
local function version_refused(T, id, version, st)
  if version == nil then return false end
  if st and st.v and st.v > version then return true end
  local tomb = redis.call("HGET", T.tombs, id)
  if not tomb then return false end
  if tonumber(redis.call("ZSCORE", T.expiry, id) or 0) <= tombstone_now(T) then
    redis.call("HDEL", T.tombs, id)
    redis.call("ZREM", T.expiry, id)
    return false
  end
  return tonumber(tomb) > version
end

-- A versioned write applied: the state holds its version, and a tombstone of
-- the job (an older delete) is gone.
local function version_applied(T, id, version, st)
  if version == nil then return end
  if st then st.v = version end
  if redis.call("HDEL", T.tombs, id) == 1 then redis.call("ZREM", T.expiry, id) end
end

-- A versioned delete leaves a tombstone of ``version`` for ``ttl_ms``.
local function tombstone_add(T, id, version, ttl_ms)
  redis.call("HSET", T.tombs, id, version)
  redis.call("ZADD", T.expiry, tombstone_now(T) + ttl_ms, id)
end

-- Drop up to 100 expired tombstones (every delete call does), so they never pile up.
local function tombstones_prune(T)
  local old = redis.call("ZRANGEBYSCORE", T.expiry, "-inf", tombstone_now(T), "LIMIT", 0, 100)
  if #old > 0 then
    redis.call("HDEL", T.tombs, unpack(old))
    redis.call("ZREM", T.expiry, unpack(old))
  end
end
