-- extend.lua: push back the lease of an in-flight occurrence (Celery retry in progress).
--
-- KEYS[1] leases  zset  id -> lease deadline ms
-- KEYS[2] state   hash  id -> runtime state (cjson)
-- ARGV[1] job id
-- ARGV[2] occurrence
-- ARGV[3] attempt
-- ARGV[4] new lease length from now, ms
-- Returns 1 if extended, 0 if the occurrence is no longer in flight
local raw = redis.call("HGET", KEYS[2], ARGV[1])
if not raw then return 0 end
local st = cjson.decode(raw)
if st.o ~= tonumber(ARGV[2]) or st.a ~= tonumber(ARGV[3]) or st.s ~= "leased" then return 0 end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call("ZADD", KEYS[1], "XX", "CH", now + tonumber(ARGV[4]), ARGV[1])
