-- heartbeat.lua: keep alive what one worker process runs and what it holds.
--
-- Running ("r" rows): each execution lease is extended only while its
-- occurrence and attempt are still the job's current ones, running, and held
-- under the fence the row names (compare-and-set), so a heartbeat can never
-- revive a settled or reaped occurrence, nor extend the lease of the worker
-- that runs it now after this one's lapsed.
-- Held ("h" rows): messages the worker received but has not started (its
-- prefetch, a countdown it waits out). A still-queued occurrence that the row's
-- message was published for (1 <= delivery <= publishes, its task) is marked
-- held by this worker, and its deadline set one lease from now: while the
-- worker heartbeats it is never republished, however long it waits; when the
-- worker dies, the reaper republishes it one lease later instead of after the
-- broker's visibility timeout. The first row of a message is its receipt.
-- The worker's name, when given, is recorded as alive, and so is each queue it
-- consumes ("q:<name>"): the reaper holds back a presumed-lost message while no
-- worker consumes its queue (it is only waiting).
--
-- KEYS[1] leases   zset  id -> execution lease deadline ms
-- KEYS[2] state    hash  id -> runtime state (cjson)
-- KEYS[3] workers  zset  worker name -> last heartbeat ms
-- KEYS[4] queued   zset  id -> delivery deadline ms (a held message: hold deadline)
-- ARGV[1] execution lease (and hold), ms from now
-- ARGV[2] worker name ("" = none)
-- ARGV[3] queues the worker consumes, space-separated ("" = none)
-- ARGV[4..] groups of 6: kind ("r" running | "h" held), id, occurrence, attempt,
--           number (r: the start's fence, "" = unfenced; h: the message's delivery
--           number), task name (h: the message's; r: "")
-- Returns {kind, id, ...} of the rows no longer running or held (stop beating for them)
local leases, state, workers, queued = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
local until_ms = now + tonumber(ARGV[1])
local worker = ARGV[2]
if worker ~= "" then redis.call("ZADD", workers, now, worker) end
for queue in string.gmatch(ARGV[3], "%S+") do redis.call("ZADD", workers, now, "q:" .. queue) end

local function hold(id, st, delivery, task)
  local n = tonumber(delivery)
  if not n or n < 1 or n > (st.x or 0) then return false end
  if st.tk and st.tk ~= task then return false end
  redis.call("ZADD", queued, "XX", until_ms, id)
  if worker ~= "" and st.w ~= worker then
    st.w = worker
    redis.call("HSET", state, id, encode_state(st))
  end
  return true
end

local gone = {}
for i = 4, #ARGV, 6 do
  local kind, id = ARGV[i], ARGV[i + 1]
  local kept = false
  if kind == "r" then
    local st = current_state(state, id, ARGV[i + 2], ARGV[i + 3], {"running"})
    if st and holder_of(st, ARGV[i + 4], "") and redis.call("ZSCORE", leases, id) then
      redis.call("ZADD", leases, "XX", until_ms, id)
      kept = true
    end
  else
    local st = current_state(state, id, ARGV[i + 2], ARGV[i + 3], {"queued", "leased"})
    kept = st ~= nil and redis.call("ZSCORE", queued, id) ~= false
      and hold(id, st, ARGV[i + 4], ARGV[i + 5])
  end
  if not kept then
    gone[#gone + 1] = kind
    gone[#gone + 1] = id
  end
end
return gone
