-- lost.lua: bring back messages a worker took from a Redis broker's list and died
-- with before the broker recorded them (beat's sweep, celery_zsched.beat.unacked).
--
-- kombu's Redis transport takes a message with BRPOP and only then records it in
-- its unacked index: a worker killed in between (its reply still unread in the
-- socket, the loop busy with another message) takes the message with it. No
-- broker has it any more, no worker holds it, nothing will start it, and its
-- occurrence waited out the 2 h delivery deadline.
--
-- Each line (a queue and a priority: one broker list) is first in, first out
-- for first deliveries; a republished occurrence goes to its front, ahead of
-- all of them (celery_zsched.beat.envelope). A mark for a line says that every
-- message of it published (claimed) before the mark has left the list: a start
-- of a first delivery promoted at the mark (it was pushed after them, behind
-- any republished one), or the list seen empty then. Beat passes marks it
-- read a lease ago: a live worker that took one of those messages has
-- recorded its hold since (heartbeat.lua, every third of a lease). So an
-- occurrence still queued, confirmed published, held by no worker, and
-- promoted a slack before its line's mark was taken by a worker that died: it
-- is due again at once (same task id), no crash counted, as rescue.lua does
-- for one the broker's unacked index names. The slack covers beats that push
-- out of claim order (several beats; one that stalled between claim and push):
-- a message pushed that late and taken as lost is only published twice, and
-- the start runs one of the two.
-- A list seen empty proves less than a start: the broker may have lost the
-- messages itself (a flush, a failover), or a router may have sent them to a
-- list beat does not know of. So beat marks an empty queue ("<queue>\31*") only
-- while a worker consuming it is alive (with none, a message only waits, as the
-- reaper holds it), and the mark counts only for an occurrence's first publish:
-- one it took for lost once more is left to the delivery deadline, so a
-- misrouted message is not published again every lease.
--
-- KEYS[1] state     hash  id -> runtime state (cjson)
-- KEYS[2] queued    zset  id -> delivery deadline ms
-- KEYS[3] schedule  zset  id -> due ms
-- KEYS[4] counters  hash  global counters
-- KEYS[5] domains   hash  domain -> learned pacing state (frees the domain's slot)
-- KEYS[6] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[7] http_wake      channel  wakes the job gateways
-- KEYS[8] queue_in_flight  hash  queue -> its occurrences in queued
-- ARGV[1] most entries of queued to look at
-- ARGV[2] look at entries of queued whose deadline is at most this (ms): past it,
--         a confirmed message was confirmed after every mark
-- ARGV[3] slack, ms: an occurrence is behind a mark if promoted this much before it
-- ARGV[4] look only at entries of queued whose deadline is more than this from now
--         (ms): the nearer ones are held by a worker (a lease from its last
--         heartbeat), under beat's publish deadline, or about to reach the delivery
--         deadline, which brings them back anyway. A fleet's prefetch, held, would
--         otherwise fill every look.
-- ARGV[5..] groups of 2: line (line_of; "<queue>\31*": every line of that
--           queue), mark (promotion time, ms on Redis' clock)
-- Returns the ids made due again
local state, queued = KEYS[1], KEYS[2]
local marks = {}
for i = 5, #ARGV, 2 do marks[ARGV[i]] = tonumber(ARGV[i + 1]) end
local slack = tonumber(ARGV[3])
-- The mark an occurrence is judged by: its list's (a start), or its queue's (the
-- lists seen empty) for a first publish.
local function mark_of(st)
  local mark = marks[line_of(st)] or 0
  local empty = marks[st.q .. "\31*"]
  if empty and (st.x or 0) <= 1 then mark = math.max(mark, empty) end
  return mark
end
local domain, flush_domains = domain_cache(KEYS[5], nil)
local rescued = {}
local ids = redis.call("ZRANGEBYSCORE", queued, "(" .. (now_ms() + tonumber(ARGV[4])), ARGV[2],
                      "LIMIT", 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local raw = redis.call("HGET", state, id)
  local st = raw and decode_state(raw)
  if st and st.s == "queued" and st.q and not st.w and st.p then
    if st.p < mark_of(st) - slack and queued_rem(queued, KEYS[8], id, st) == 1 then
      due_again(st, id, domain, KEYS[3], KEYS[6], KEYS[7])
      redis.call("HSET", state, id, encode_state(st))
      rescued[#rescued + 1] = id
    end
  end
end
flush_domains()
if #rescued > 0 then redis.call("HINCRBY", KEYS[4], "orphaned", #rescued) end
return rescued
