-- rescue.lua: bring back messages a dead worker took from the broker unrecorded.
--
-- A worker records what it received and has not started (its hold) with its
-- heartbeat; a message it took and died with before that heartbeat has no
-- hold, and waits in the Redis broker's unacked index for the broker's
-- visibility timeout (an hour, by default). Beat finds those entries once they
-- are a lease old (celery_zsched.unacked) and names their occurrences here.
-- Each that is still queued for exactly that publish, and held by no worker, is
-- due again at once (same task id), no crash counted: nothing started it, and
-- a live worker would have recorded its hold within a heartbeat. A later
-- publish, a start, or a worker's hold leaves it alone.
--
-- KEYS[1] state     hash  id -> runtime state (cjson)
-- KEYS[2] queued    zset  id -> delivery deadline ms
-- KEYS[3] schedule  zset  id -> due ms
-- KEYS[4] counters  hash  global counters
-- KEYS[5] domains   hash  domain -> learned pacing state (frees the domain's slot)
-- KEYS[6] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[7] http_wake      channel  wakes the job gateways
-- KEYS[8] queue_in_flight  hash  queue -> its occurrences in queued
-- ARGV[1..] groups of 4: id, occurrence, attempt, the message's delivery number
-- Returns the ids made due again
local state, queued, schedule, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local domain, flush_domains = domain_cache(KEYS[5], nil)
local rescued = {}
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  local st = current_state(state, id, ARGV[i + 1], ARGV[i + 2], {"queued"})
  if st and not st.w and st.x == tonumber(ARGV[i + 3])
      and queued_rem(queued, KEYS[8], id, st) == 1 then
    due_again(st, id, domain, schedule, KEYS[6], KEYS[7])
    redis.call("HSET", state, id, encode_state(st))
    rescued[#rescued + 1] = id
  end
end
flush_domains()
if #rescued > 0 then redis.call("HINCRBY", counters, "orphaned", #rescued) end
return rescued
