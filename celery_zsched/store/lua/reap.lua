-- reap.lua: recover occurrences whose worker or beat died, or whose message was lost.
--
-- The deadlines and their meanings:
--   * an execution lease that ended with no heartbeat means the worker died
--     mid-task: the same occurrence and attempt become due again (same task
--     id) and one crash is counted; after max_deliveries crashes the job is
--     dead-lettered;
--   * a hold that ended (a worker received the message, then stopped
--     heartbeating before it started it: killed with its prefetch) and a
--     publish deadline that passed (beat died between its claim and the
--     confirmation of its publish): nothing will start it, so it becomes due
--     again at once (same task id), with no crash counted: it never ran;
--   * a delivery deadline that passed means the message never started. If a
--     worker consuming its queue is alive, the broker lost it: it is
--     republished (same task id), and no crash is counted. If none is, it is
--     only waiting: its deadline is pushed back and nothing is republished, so
--     a worker outage of any length never adds a message nor dead-letters
--     anything. (An occurrence whose queue beat did not record, written by an
--     older beat, asks whether any worker at all is alive.)
-- Entries with the status "leased" predate execution leases (they were
-- promoted under the old meaning); they are converted to queued, with a
-- delivery deadline counted from their promotion.
--
-- KEYS[1] leases    zset  id -> execution lease deadline ms
-- KEYS[2] queued    zset  id -> delivery deadline ms
-- KEYS[3] schedule  zset  id -> due ms
-- KEYS[4] state     hash  id -> runtime state (cjson)
-- KEYS[5] dead      zset  id -> time of death ms
-- KEYS[6] defs      hash  id -> definition JSON
-- KEYS[7] counters  hash  global counters
-- KEYS[8] workers   zset  worker name -> last heartbeat ms
-- KEYS[9] domains   hash  domain -> learned pacing state (an occurrence that
--                         leaves flight here frees its domain's slot)
-- KEYS[10] http_schedule zset id -> due ms of transport "http" jobs
-- KEYS[11] http_wake    channel  wakes the job gateways
-- KEYS[12] queue_in_flight  hash  queue -> its occurrences in queued
-- ARGV[1] most entries to look at, per deadline kind
-- ARGV[2] crashed executions of one occurrence before it is dead-lettered
-- ARGV[3] delivery deadline, ms
-- ARGV[4] a worker counts as alive this long after its last heartbeat, ms
-- Returns {crashed and redelivered, dead-lettered, lost and republished,
--          held back (no worker alive), converted from "leased", orphaned (held
--          by a worker that died), unpublished (claimed by a beat that died),
--          then the ids redelivered or republished, then the ids dead-lettered
--          (the last "dead-lettered" of them)}
local leases, queued, schedule, state, dead, defs, counters, workers =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local http, wake, counts = KEYS[10], KEYS[11], KEYS[12]
local now = now_ms()
local limit, max_deliveries = tonumber(ARGV[1]), tonumber(ARGV[2])
local delivery_ms, alive_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {0, 0, 0, 0, 0, 0, 0}
local dead_ids = {}

local domain, flush_domains = domain_cache(KEYS[9], nil)

-- The state of a live job, or nil (forgetting the state of a deleted one,
-- which leaves ``queued`` with it).
local function live_state(id)
  local raw = redis.call("HGET", state, id)
  if raw and redis.call("HEXISTS", defs, id) == 1 then return decode_state(raw) end
  if raw then
    local st = decode_state(raw)
    domain_land(domain, st, id)
    queued_rem(queued, counts, id, st)
    redis.call("HDEL", state, id)
  end
  return nil
end

local function reschedule(id, st)
  due_again(st, id, domain, schedule, http, wake)
end

for _, id in ipairs(redis.call("ZRANGEBYSCORE", leases, "-inf", now, "LIMIT", 0, limit)) do
  redis.call("ZREM", leases, id)
  local st = live_state(id)
  if st and st.s == "leased" then
    -- It was published (under the old meaning, too): confirmed, to a queue unknown.
    st.s, st.d, st.q, st.x, st.bq = "queued", 0, st.q or "", math.max(st.x or 0, 1), nil
    redis.call("ZADD", queued, (st.p or now) + delivery_ms, id)
    redis.call("HSET", state, id, encode_state(st))
    out[5] = out[5] + 1
  elseif st and st.s == "running" then
    st.d = (st.d or 0) + 1
    if st.d >= max_deliveries then
      st.s = "dead"
      domain_land(domain, st, id)
      redis.call("ZADD", dead, now, id)
      out[2] = out[2] + 1
      dead_ids[#dead_ids + 1] = id
    else
      reschedule(id, st)
      out[1] = out[1] + 1
      out[#out + 1] = id
    end
    redis.call("HSET", state, id, encode_state(st))
  end
end

redis.call("ZREMRANGEBYSCORE", workers, "-inf", now - 10 * alive_ms)
local any_alive = #redis.call("ZRANGEBYSCORE", workers, now - alive_ms, "+inf", "LIMIT", 0, 1) > 0
local function consumed(queue)
  if queue == "" then return any_alive end
  local seen = redis.call("ZSCORE", workers, "q:" .. queue)
  return seen and tonumber(seen) >= now - alive_ms
end
for _, id in ipairs(redis.call("ZRANGEBYSCORE", queued, "-inf", now, "LIMIT", 0, limit)) do
  local st = live_state(id)
  if not st or (st.s ~= "queued" and st.s ~= "leased") then
    queued_rem(queued, counts, id, st)
  elseif st.w or not st.q then
    local slot = st.w and 6 or 7
    queued_rem(queued, counts, id, st)
    st.w = nil
    reschedule(id, st)
    redis.call("HSET", state, id, encode_state(st))
    out[slot] = out[slot] + 1
    out[#out + 1] = id
  elseif not consumed(st.q) then
    redis.call("ZADD", queued, now + delivery_ms, id)
    out[4] = out[4] + 1
  else
    queued_rem(queued, counts, id, st)
    reschedule(id, st)
    redis.call("HSET", state, id, encode_state(st))
    out[3] = out[3] + 1
    out[#out + 1] = id
  end
end
flush_domains()
for _, id in ipairs(dead_ids) do out[#out + 1] = id end
if out[1] > 0 then redis.call("HINCRBY", counters, "redelivered", out[1]) end
if out[2] > 0 then redis.call("HINCRBY", counters, "dead", out[2]) end
if out[3] > 0 then redis.call("HINCRBY", counters, "lost", out[3]) end
if out[6] > 0 then redis.call("HINCRBY", counters, "orphaned", out[6]) end
if out[7] > 0 then redis.call("HINCRBY", counters, "unpublished", out[7]) end
return out
