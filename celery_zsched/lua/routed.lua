-- routed.lua: record the queue each published occurrence was routed to.
--
-- Beat calls it right after a batch is published. The reaper then asks
-- whether a worker consuming that queue is alive before it presumes a message
-- lost, so workers of other queues never make waiting messages look lost.
--
-- KEYS[1] state  hash  id -> runtime state (cjson)
-- ARGV    groups of 4: id, occurrence, attempt, queue name
-- Returns the number recorded (occurrences still queued as published)
local state = KEYS[1]
local recorded = 0
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  local st = current_state(state, id, ARGV[i + 1], ARGV[i + 2], {"queued", "running"})
  if st then
    st.q = ARGV[i + 3]
    redis.call("HSET", state, id, encode_state(st))
    recorded = recorded + 1
  end
end
return recorded
