-- start.lua: a worker starts an occurrence: compare-and-set queued -> running.
--
-- Exactly one delivery of an occurrence and attempt gets "ok"; any other
-- delivery (a duplicate message, a republished one whose original showed up,
-- a broker redelivery after the run started) finds it running or settled and
-- is dropped without running the task. The execution lease starts here and
-- the worker's heartbeat keeps it alive (heartbeat.lua).
--
-- KEYS[1] state     hash  id -> runtime state (cjson)
-- KEYS[2] queued    zset  id -> delivery deadline ms
-- KEYS[3] leases    zset  id -> execution lease deadline ms
-- KEYS[4] schedule  zset  id -> due ms
-- KEYS[5] counters  hash  global counters
-- ARGV[1] job id
-- ARGV[2] occurrence
-- ARGV[3] attempt
-- ARGV[4] execution lease, ms from now
-- ARGV[5] expiry, ms after promotion ("" = never expires)
-- Returns {"ok", now, due_ms, promoted_ms} | {"expired", now, promoted_ms}
--       | {"duplicate", status} | {"stale", status} | {"gone", ""}  (these three count
--         as "duplicates": deliveries that did not run)
local state, queued, leases, schedule, counters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, occ, attempt = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- Every delivery that does not run is counted as a duplicate.
local function drop(kind, status)
  redis.call("HINCRBY", counters, "duplicates", 1)
  return {kind, status}
end
local raw = redis.call("HGET", state, id)
if not raw then return drop("gone", "") end
local st = decode_state(raw)
if st.o ~= occ or st.a ~= attempt then return drop("stale", st.s or "") end
-- "leased" is the queued status of stores written before execution leases
-- existed; "scheduled" is an occurrence whose message was presumed lost and is
-- waiting to be republished: the original showed up, so it runs now instead.
if st.s ~= "queued" and st.s ~= "leased" and st.s ~= "scheduled" then
  return drop("duplicate", st.s or "")
end
local now = now_ms()
local promoted = st.p or now
if ARGV[5] ~= "" and now > promoted + tonumber(ARGV[5]) then
  return {"expired", now, promoted}
end
redis.call("ZREM", queued, id)
redis.call("ZREM", schedule, id)
redis.call("ZADD", leases, now + tonumber(ARGV[4]), id)
st.s, st.sa = "running", now
redis.call("HSET", state, id, encode_state(st))
redis.call("HINCRBY", counters, "started", 1)
return {"ok", now, st.due or promoted, promoted}
