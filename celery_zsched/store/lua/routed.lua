-- routed.lua: confirm the publish of each occurrence, and record where it went.
--
-- Beat calls it right after a batch is published. Until then a claimed
-- occurrence sits under the short publish deadline (claim.lua), so one whose
-- beat died before publishing comes back within seconds; the confirmation
-- moves it to the long delivery deadline, under which a message only waits.
-- The queue lets the reaper ask whether a worker consuming that queue is alive
-- before it presumes a message lost, so workers of other queues never make
-- waiting messages look lost; the task is the one start.lua accepts.
-- Only the publish numbered so is confirmed: a claim made again meanwhile (its
-- deadline passed while this beat was slow) waits for its own beat. The
-- priority, with the queue, names the broker list the message waits in (its
-- line, line_of): lost.lua tells a message that waits from one that was taken.
--
-- KEYS[1] state   hash  id -> runtime state (cjson)
-- KEYS[2] queued  zset  id -> deadline ms (publish, delivery or hold)
-- ARGV[1] delivery deadline, ms from now
-- ARGV[2..] groups of 7: id, occurrence, attempt, delivery number (publishes at
--           the claim), queue name ("" = one the router did not name), task name,
--           priority ("" = none)
-- Returns the number recorded (occurrences still queued or running as published)
local state, queued = KEYS[1], KEYS[2]
local deliver_by = now_ms() + tonumber(ARGV[1])
local recorded = 0
for i = 2, #ARGV, 7 do
  local id = ARGV[i]
  local st = current_state(state, id, ARGV[i + 1], ARGV[i + 2], {"queued", "running"})
  if st and st.x == tonumber(ARGV[i + 3]) then
    st.q, st.tk, st.pr = ARGV[i + 4], ARGV[i + 5], tonumber(ARGV[i + 6])
    -- A worker that received it already holds it under its own, shorter deadline.
    if st.s == "queued" and not st.w then redis.call("ZADD", queued, "XX", deliver_by, id) end
    redis.call("HSET", state, id, encode_state(st))
    recorded = recorded + 1
  end
end
return recorded
