-- heartbeat.lua: keep the execution leases of one worker process's running tasks alive.
--
-- Each lease is extended only while its occurrence and attempt are still the
-- job's current ones and running (compare-and-set), so a heartbeat can never
-- revive a settled or reaped occurrence. The worker's name, when given, is
-- recorded as alive, and so is each queue it consumes ("q:<name>"): the
-- reaper holds back a presumed-lost message while no worker consumes its
-- queue (it is only waiting).
--
-- KEYS[1] leases   zset  id -> execution lease deadline ms
-- KEYS[2] state    hash  id -> runtime state (cjson)
-- KEYS[3] workers  zset  worker name -> last heartbeat ms
-- ARGV[1] execution lease, ms from now
-- ARGV[2] worker name ("" = none)
-- ARGV[3] queues the worker consumes, space-separated ("" = none)
-- ARGV[4..] groups of 3: id, occurrence, attempt
-- Returns the ids whose occurrence is no longer running (stop beating for them)
local leases, state, workers = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local until_ms = now + tonumber(ARGV[1])
if ARGV[2] ~= "" then redis.call("ZADD", workers, now, ARGV[2]) end
for queue in string.gmatch(ARGV[3], "%S+") do redis.call("ZADD", workers, now, "q:" .. queue) end
local gone = {}
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  if current_state(state, id, ARGV[i + 1], ARGV[i + 2], {"running"})
      and redis.call("ZSCORE", leases, id) then
    redis.call("ZADD", leases, "XX", until_ms, id)
  else
    gone[#gone + 1] = id
  end
end
return gone
