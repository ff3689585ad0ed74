-- release.lua: give back claimed jobs that could not be published.
--
-- Each job returns to the schedule at its due time without counting a
-- publish, so a broker outage delays jobs but never loses or kills them.
--
-- KEYS[1] queued    zset  id -> delivery deadline ms
-- KEYS[2] schedule  zset  id -> due ms
-- KEYS[3] state     hash  id -> runtime state (cjson)
-- KEYS[4] domains   hash  domain -> learned pacing state (frees the domain's slot)
-- ARGV    groups of 3: id, occurrence, attempt
-- Returns the number released
local queued, schedule, state = KEYS[1], KEYS[2], KEYS[3]
local domain, flush_domains = domain_cache(KEYS[4], nil)
local released = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  local st = current_state(state, id, ARGV[i + 1], ARGV[i + 2], {"queued"})
  if st and redis.call("ZREM", queued, id) == 1 then
    st.s, st.x = "scheduled", math.max(0, (st.x or 1) - 1)
    domain_land(domain, st, id)
    redis.call("ZADD", schedule, st.due or st.o, id)
    redis.call("HSET", state, id, encode_state(st))
    released = released + 1
  end
end
flush_domains()
return released
