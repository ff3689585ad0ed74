-- claim.lua: atomically take a batch of due jobs and mark them queued (beat)
-- or running (the job gateway).
--
-- One script call claims each due occurrence for exactly one caller, however
-- many beat processes (or gateways) run it at once: there is no leader lock.
-- Beat: a claimed occurrence is queued under a short *publish* deadline, until
-- beat confirms the publish (routed.lua sets the long delivery deadline): if
-- beat dies between claim and publish, the reaper brings it back at once
-- after that deadline. Only a worker's start (start.lua) turns it into a
-- running execution with a short lease. The gateway claims from the HTTP
-- schedule straight into running under its execution lease (ARGV[5] =
-- "running", KEYS[2] = leases): there is no broker to wait in, and each
-- claim numbers its holder (fencing, ``k``). Backpressure: at most ARGV[3]
-- occurrences may sit in KEYS[2]; past that, due jobs stay in the schedule.
-- Backpressure per queue (ARGV[7] > 0, beat): at most ARGV[7] occurrences of one
-- queue (the job's ``queue`` field, "" for none) may sit in KEYS[2], counted in
-- KEYS[9]. A due job whose queue is at its bound is held back: it stays in the
-- schedule, moved past PARK_BASE (its due time kept), so it neither takes the
-- batch of the next claims nor hides the other queues' due jobs; KEYS[10]
-- counts the held per queue. A claim that finds room in a queue with held jobs
-- takes them back first, earliest due first.
-- Pacing (ARGV[4]): a due job whose domain's gate is closed, whose domain is at
-- its cap, or whose breaker is open is not claimed; it moves to the next free
-- slot of its domain (the same occurrence, a later due time) and counts as held.
--
-- KEYS[1] schedule  zset  id -> due ms (the gateway: the HTTP schedule)
-- KEYS[2] queued    zset  id -> delivery deadline ms (the gateway: leases)
-- KEYS[3] leases    zset  id -> execution lease deadline ms (running)
-- KEYS[4] state     hash  id -> runtime state (cjson)
-- KEYS[5] defs      hash  id -> definition JSON
-- KEYS[6] counters  hash  global counters
-- KEYS[7] domains      hash  domain -> learned pacing state (cjson)
-- KEYS[8] domain_conf  hash  domain -> operator overrides (cjson)
-- KEYS[9] queue_in_flight  hash  queue -> its occurrences in KEYS[2]
-- KEYS[10] queue_held      hash  queue -> its jobs held back (past PARK_BASE)
-- ARGV[1] most jobs to claim
-- ARGV[2] deadline of a claimed occurrence, ms from now: the publish deadline
--         (beat) or the execution lease (the gateway)
-- ARGV[3] most occurrences in KEYS[2] (backpressure bound)
-- ARGV[4] pacing settings JSON ("" = pacing off)
-- ARGV[5] status of a claimed occurrence: queued (beat) | running (the gateway)
-- ARGV[6] only jobs whose queue field is this ("" = any queue)
-- ARGV[7] most occurrences of one queue in KEYS[2] (0 = no per-queue bound)
-- Returns {now_ms, next_due_ms or -1, next_deadline_ms or -1, slots left, held,
--          held back by their queue's bound,
--          then per job: id, definition JSON, occurrence, attempt, publishes, due_ms,
--          fence (the holder's number: the gateway's lease token carries it),
--          validators JSON {et, lm, sg} of the last visit ("" = none)}
-- next_due_ms is the schedule's first score; for the gateway, its first score
-- in the future (jobs already due that a queue filter skipped do not count);
-- now when held-back jobs of a queue with room wait to be taken back.
local schedule, queued, leases, state, defs, counters =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms()
local deliver_by = now + tonumber(ARGV[2])
local room = tonumber(ARGV[3]) - redis.call("ZCARD", queued)
local limit = math.min(tonumber(ARGV[1]), room)
local P = pacing_config(ARGV[4])
local status, only_queue = ARGV[5], ARGV[6]
-- Most due entries one filtered claim looks at: a filter skips other queues'
-- jobs, and this bounds what a claim costs when many of them are due.
local SCAN_MAX = 10 * CHUNK
local domain, flush_domains, preload_domains = domain_cache(KEYS[7], KEYS[8])
local queue_bound, counts, held_key = tonumber(ARGV[7]), KEYS[9], KEYS[10]
local per_queue = queue_bound > 0 and status == "queued"

local function hash_map(key)
  local flat, map = redis.call("HGETALL", key), {}
  for i = 1, #flat, 2 do map[flat[i]] = tonumber(flat[i + 1]) end
  return map
end

local function queue_of(def)
  -- Definitions are written by json.dumps, which leaves out a job's queue when it
  -- has none: most claims then decode nothing (one with a "queue" key anywhere,
  -- in its meta too, is decoded).
  if not string.find(def, '"queue"', 1, true) then return "" end
  local q = decode_json(def).queue
  if type(q) ~= "string" then return "" end
  return q
end

-- nil when job ``id`` (due at ``score``) may go now, and its grant is recorded;
-- else the time it is held back to.
local function pace(e, st, id, score)
  local s, delay = e.rec, domain_delay(e, P)
  local cap = e.conf.cap or P.cap
  if s.b == "open" then
    if now < (s.bo or 0) then return domain_reserve(e, s.bo, delay) end
    s.b, s.pj, e.dirty = "half", nil, true
  end
  if s.b == "half" and s.pj then return domain_reserve(e, now + math.max(delay, PACING_RECHECK_MS), delay) end
  local gate = math.max((s.L or 0) + delay, s.cu or 0)
  local full = cap > 0 and (s.n or 0) >= cap
  local owner = st.rv == score
  if gate <= now and not full and (owner or (s.R or 0) <= now) then
    s.L, s.n = now, (s.n or 0) + 1
    if s.b == "half" then s.pj = id end
    st.fd, st.rv, e.dirty = st.dm, nil, true
    return nil
  end
  local at = math.max(gate, now + 1)
  if full then
    -- At its cap, the job goes to the end of the domain's line: the line moves
    -- one slot per delay, so a domain costs at most one hold per delay however
    -- many of its jobs wait (bunching them at one re-check time made every
    -- waiting job come due again at once).
    return domain_reserve(e, math.max(at, now + math.max(delay, PACING_RECHECK_MS)), delay)
  end
  if owner then
    -- It holds a slot and missed it only by the previous grant's lateness:
    -- wait for the gate, not for the end of the line.
    s.h, e.dirty = (s.h or 0) + 1, true
    return at
  end
  return domain_reserve(e, at, delay)
end

local out = {now, -1, -1, 0, 0, 0}
local scan_full, park_walk_full = false, false
local claimed, held, parked = 0, 0, 0
-- Per queue: occurrences queued, jobs held back, and what this claim changes.
local in_flight, hints, hint_delta, hints_exact, added = {}, {}, {}, false, {}
local queues = {}  -- the queue of each candidate taken back, by position
local function free(q) return queue_bound - (in_flight[q] or 0) end
local function unparkable()
  for q, n in pairs(hints) do
    if n + (hint_delta[q] or 0) > 0 and free(q) > 0 then return true end
  end
  return false
end
local counted = false
local function load_counts()
  if per_queue and not counted then in_flight, counted = hash_map(counts), true end
end
-- An idle claim asks only how many queues have held-back jobs (usually none): the
-- counts are read when there is something to decide.
if per_queue and redis.call("HLEN", held_key) > 0 then
  hints = hash_map(held_key)
  load_counts()
end
if limit > 0 then
  local ids, scores, found_defs = {}, {}, {}
  if per_queue and unparkable() then
    -- Take back held jobs of queues with room, earliest due first: they have
    -- waited longest. A walk that reads every held job also corrects the counts.
    local seen, taking, offset = {}, {}, 0
    while #ids < limit and offset < SCAN_MAX do
      local page = redis.call("ZRANGEBYSCORE", schedule, PARK_BASE, "+inf", "WITHSCORES",
                              "LIMIT", offset, CHUNK)
      local names = {}
      for i = 1, #page, 2 do names[#names + 1] = page[i] end
      local page_defs = hmget_all(defs, names)
      for k, id in ipairs(names) do
        local def = page_defs[k]
        local q = def and queue_of(def) or ""
        seen[q] = (seen[q] or 0) + 1
        if #ids < limit and (not def or free(q) - (taking[q] or 0) > 0) then
          local n = #ids + 1
          ids[n], scores[n], found_defs[n], queues[n] = id, tonumber(page[2 * k]) - PARK_BASE, def, q
          taking[q] = (taking[q] or 0) + 1
          hint_delta[q] = (hint_delta[q] or 0) - 1
        end
      end
      offset = offset + #names
      -- A short page: the walk has read every held job.
      if #names < CHUNK then hints_exact = true break end
    end
    park_walk_full = offset >= SCAN_MAX
    if hints_exact then hints = seen end
  end
  if only_queue == "" then
    local due = redis.call("ZRANGEBYSCORE", schedule, "-inf", now, "WITHSCORES", "LIMIT", 0,
                           limit - #ids)
    local names = {}
    for i = 1, #due, 2 do names[#names + 1] = due[i] end
    -- One HMGET each for the batch's definitions, states and domains, rather
    -- than a read per job.
    local due_defs = hmget_all(defs, names)
    for k, id in ipairs(names) do
      local n = #ids + 1
      ids[n], scores[n], found_defs[n] = id, tonumber(due[2 * k]), due_defs[k]
    end
    if #names > 0 then load_counts() end
  else
    found_defs = {}
    local offset = 0
    while #ids < limit and offset < SCAN_MAX do
      local due = redis.call("ZRANGEBYSCORE", schedule, "-inf", now, "WITHSCORES", "LIMIT", offset, CHUNK)
      if #due == 0 then break end
      local page = {}
      for i = 1, #due, 2 do page[#page + 1] = due[i] end
      local page_defs = hmget_all(defs, page)
      for k, id in ipairs(page) do
        local def = page_defs[k]
        if #ids < limit and (not def or decode_json(def).queue == only_queue) then
          local n = #ids + 1
          ids[n], scores[n], found_defs[n] = id, tonumber(due[2 * k]), def
        end
      end
      offset = offset + #page
      if #page < CHUNK then break end
    end
    if offset >= SCAN_MAX then scan_full = true end
  end
  local found_states = hmget_all(state, ids)
  local states, names, seen = {}, {}, {}
  for k, id in ipairs(ids) do
    if found_defs[k] then
      local raw = found_states[k]
      local st = raw and decode_state(raw) or new_state(scores[k])
      states[k] = st
      if P and st.dm and not seen[st.dm] then
        seen[st.dm] = true
        names[#names + 1] = st.dm
      end
    end
  end
  preload_domains(names)
  for first = 1, #ids, CHUNK do
    redis.call("ZREM", schedule, unpack(ids, first, math.min(#ids, first + CHUNK - 1)))
  end
  for k, id in ipairs(ids) do
    local score = scores[k]
    local def, st = found_defs[k], states[k]
    local q = per_queue and def and (queues[k] or queue_of(def))
    if q and free(q) <= 0 then
      -- Its queue is at its bound: held back, out of the due range, due time kept.
      redis.call("ZADD", schedule, PARK_BASE + score, id)
      hint_delta[q] = (hint_delta[q] or 0) + 1
      parked = parked + 1
    elseif def then
      local hold = P and st.dm and pace(domain(st.dm), st, id, score)
      if hold then
        st.rv = hold
        redis.call("ZADD", schedule, hold, id)
        redis.call("HSET", state, id, encode_state(st))
        held = held + 1
      else
        st.x = (st.x or 0) + 1
        st.s, st.due, st.p = status, score, now
        -- A new hand-out: not confirmed published, held by no worker yet.
        st.q, st.w, st.tk, st.pr = nil, nil, nil, nil
        if status == "running" then st.sa, st.k = now, (st.k or 0) + 1 end
        -- queued_add's accounting, with one HINCRBY per queue for the batch.
        if redis.call("ZADD", queued, deliver_by, id) == 1 and q then
          st.bq = q
          in_flight[q] = (in_flight[q] or 0) + 1
          added[q] = (added[q] or 0) + 1
        end
        redis.call("HSET", state, id, encode_state(st))
        claimed = claimed + 1
        out[#out + 1] = id
        out[#out + 1] = def
        out[#out + 1] = st.o
        out[#out + 1] = st.a
        out[#out + 1] = st.x
        out[#out + 1] = score
        out[#out + 1] = st.k or 0
        -- The validators of the last visit, for a conditional fetch ("" = none).
        out[#out + 1] = (st.et or st.lm or st.sg)
          and encode_json({et = st.et, lm = st.lm, sg = st.sg}) or ""
      end
    else
      redis.call("HDEL", state, id)
    end
  end
end
if claimed > 0 then
  redis.call("HINCRBY", counters, "promoted", claimed)
  if status == "running" then redis.call("HINCRBY", counters, "started", claimed) end
end
if held > 0 then redis.call("HINCRBY", counters, "held", held) end
if parked > 0 then redis.call("HINCRBY", counters, "queue_held", parked) end
for q, n in pairs(added) do redis.call("HINCRBY", counts, q, n) end
flush_domains()
out[4], out[5], out[6] = math.max(0, room - claimed), held, parked
if per_queue then
  -- The held-back counts: rewritten from the walk when it read every held job
  -- (so a held job paused, deleted or run now meanwhile stops counting), else
  -- moved by what this claim took back and held.
  if hints_exact then
    for q, d in pairs(hint_delta) do hints[q] = (hints[q] or 0) + d end
    redis.call("DEL", held_key)
    for q, n in pairs(hints) do
      if n > 0 then redis.call("HSET", held_key, q, n) end
    end
  else
    for q, d in pairs(hint_delta) do
      hints[q] = (hints[q] or 0) + d
      if d ~= 0 and redis.call("HINCRBY", held_key, q, d) <= 0 then redis.call("HDEL", held_key, q) end
    end
  end
  hint_delta = {}
end
local nd
if status == "running" then
  nd = redis.call("ZRANGEBYSCORE", schedule, "(" .. now, "+inf", "WITHSCORES", "LIMIT", 0, 1)
else
  nd = redis.call("ZRANGE", schedule, 0, 0, "WITHSCORES")
end
if nd[2] then out[2] = tonumber(nd[2]) end
if out[2] >= PARK_BASE then out[2] = -1 end
-- Held-back jobs whose queue has room again: come back for them at once (soon,
-- when the walk stopped at its bound before reaching them).
if per_queue and out[4] > 0 and unparkable() then out[2] = park_walk_full and now + 100 or now end
-- A filtered claim that stopped at its scan bound has not seen every due job:
-- look again soon rather than sleep until the next future one.
if scan_full and (out[2] < 0 or out[2] > now + 100) then out[2] = now + 100 end
local nq = redis.call("ZRANGE", queued, 0, 0, "WITHSCORES")
local nl = redis.call("ZRANGE", leases, 0, 0, "WITHSCORES")
if nq[2] then out[3] = tonumber(nq[2]) end
if nl[2] and (out[3] < 0 or tonumber(nl[2]) < out[3]) then out[3] = tonumber(nl[2]) end
return out
