-- release.lua: give back claimed jobs that could not be handed to a worker.
--
-- Beat releases the ones it could not publish (status "queued"); the job
-- gateway the ones it claimed for a poller that went away before the answer
-- (status "running"). Each job returns to its schedule at its due time without
-- counting a delivery, so an outage delays jobs but never loses or kills them.
--
-- KEYS[1] queued    zset  id -> delivery deadline ms (the gateway: leases, running)
-- KEYS[2] schedule  zset  id -> due ms
-- KEYS[3] state     hash  id -> runtime state (cjson)
-- KEYS[4] domains   hash  domain -> learned pacing state (frees the domain's slot)
-- KEYS[5] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[6] http_wake      channel  wakes the job gateways
-- KEYS[7] queue_in_flight  hash  queue -> its occurrences in queued (beat only)
-- ARGV[1] the status the jobs were claimed into: queued | running
-- ARGV[2..] groups of 3: id, occurrence, attempt
-- Returns the number released
local held, schedule, state, http, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6]
local domain, flush_domains = domain_cache(KEYS[4], nil)
local released = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local st = current_state(state, id, ARGV[i + 1], ARGV[i + 2], {ARGV[1]})
  if st and queued_rem(held, ARGV[1] == "queued" and KEYS[7] or nil, id, st) == 1 then
    st.s, st.x, st.sa = "scheduled", math.max(0, (st.x or 1) - 1), nil
    domain_land(domain, st, id)
    schedule_add(st, id, st.due or st.o, schedule, http, wake)
    redis.call("HSET", state, id, encode_state(st))
    released = released + 1
  end
end
flush_domains()
return released
