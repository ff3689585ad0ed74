-- retrying.lua: a running task retries through Celery's own Task.retry.
--
-- That is not an outcome yet: the occurrence goes back to queued (its retry
-- message waits in the broker, or in a worker until its countdown ends) under
-- a delivery deadline, so the retry's start (start.lua) is accepted. Only the
-- execution holding the occurrence (its fence) may do this. Its due time
-- becomes the retry's, so a retry whose worker dies while it waits out the
-- countdown is republished for that time, not earlier.
--
-- KEYS[1] leases  zset  id -> execution lease deadline ms
-- KEYS[2] queued  zset  id -> delivery deadline ms
-- KEYS[3] state   hash  id -> runtime state (cjson)
-- KEYS[4] queue_in_flight  hash  queue -> its occurrences in queued (the retry
--         counts under the queue its claim counted it in)
-- ARGV[1] job id
-- ARGV[2] occurrence
-- ARGV[3] attempt
-- ARGV[4] delivery deadline, ms from now (countdown + delivery timeout)
-- ARGV[5] countdown, ms from now
-- ARGV[6] fence of the execution retrying ("" = unfenced)
-- Returns 1 if requeued, 0 if the occurrence is no longer running
local leases, queued, state = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local st = current_state(state, id, ARGV[2], ARGV[3], {"running"})
if not st or not holder_of(st, ARGV[6], "") then return 0 end
local now = now_ms()
redis.call("ZREM", leases, id)
queued_add(queued, KEYS[4], id, now + tonumber(ARGV[4]), st, st.bq)
-- The retry message is published (Task.retry sent it before this call): a
-- confirmed publish, to the queue it came from.
st.s, st.p, st.due, st.q = "queued", now, now + tonumber(ARGV[5]), st.q or ""
redis.call("HSET", state, id, encode_state(st))
return 1
