-- relocate.lua: move whole jobs between partitions while the store runs (a paced
-- job whose domain changed belongs in the new domain's partition).
--
-- Each step is atomic on one partition; the store runs them in this order:
--   1. "take" in the job's partition: a job with nothing in flight (neither
--      queued nor running) is taken out whole (definition, state, schedule
--      entry, paused, static, dead letter) and parked in the ``moving`` hash
--      as one JSON record, so it can no longer be claimed there, and a crash
--      after this step loses nothing (the move resumes from the parked record).
--      A job in flight is left as it is and reported "busy".
--   2. the directory entry (in the id's own partition) names the new one;
--   3. "restore" in the new partition writes the record back whole, unless the
--      job is there already (a resumed move);
--   4. the parked record is dropped ("drop", in the old partition).
-- A job is never claimable in two partitions at once, and a reader that
-- follows the directory between 1 and 3 finds it absent for that moment.
--
-- KEYS[1] defs      hash  id -> definition JSON
-- KEYS[2] state     hash  id -> runtime state (cjson)
-- KEYS[3] schedule  zset  id -> due ms
-- KEYS[4] http_schedule  zset  id -> due ms of transport "http" jobs
-- KEYS[5] queued    zset  id -> delivery deadline ms
-- KEYS[6] leases    zset  id -> execution lease deadline ms
-- KEYS[7] paused    set   paused ids
-- KEYS[8] static    set   ids that come from beat_schedule
-- KEYS[9] dead      zset  dead-lettered id -> time it died
-- KEYS[10] moving   hash  id -> parked record (JSON) of a move under way
-- KEYS[11] http_wake  channel  wakes the job gateways
-- ARGV[1] operation: take | restore | drop
-- ARGV[2..] groups of 3: id, the partition it moves to (take), the record (restore)
-- Returns, per row: take: "absent" | "busy" | the record JSON;
--                   restore: "restored" | "present"; drop: "dropped"
local defs, state, schedule, http, queued, leases, paused, static, dead, moving, wake =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
  KEYS[10], KEYS[11]
local op = ARGV[1]
local out = {}

local function take(id, to)
  local parked = redis.call("HGET", moving, id)
  if parked then return parked end -- an interrupted move: finish that one
  local def = redis.call("HGET", defs, id)
  if not def then return "absent" end
  if redis.call("ZSCORE", queued, id) or redis.call("ZSCORE", leases, id) then
    return "busy"
  end
  local rec = {
    id = id, to = tonumber(to), def = def,
    st = redis.call("HGET", state, id) or "",
    sch = redis.call("ZSCORE", schedule, id) or "",
    http = redis.call("ZSCORE", http, id) or "",
    dead = redis.call("ZSCORE", dead, id) or "",
    paused = redis.call("SISMEMBER", paused, id),
    static = redis.call("SISMEMBER", static, id),
  }
  local raw = encode_json(rec)
  -- Parked first, in the same script as the delete: nothing is ever only in flight.
  redis.call("HSET", moving, id, raw)
  redis.call("HDEL", defs, id)
  redis.call("HDEL", state, id)
  redis.call("ZREM", schedule, id)
  redis.call("ZREM", http, id)
  redis.call("ZREM", dead, id)
  redis.call("SREM", paused, id)
  redis.call("SREM", static, id)
  return raw
end

local function restore(id, raw)
  if redis.call("HEXISTS", defs, id) == 1 then return "present" end
  local rec = decode_json(raw)
  redis.call("HSET", defs, id, rec.def)
  if rec.st ~= "" then redis.call("HSET", state, id, rec.st) end
  if rec.sch ~= "" then redis.call("ZADD", schedule, rec.sch, id) end
  if rec.http ~= "" then
    redis.call("ZADD", http, rec.http, id)
    redis.call("PUBLISH", wake, rec.http)
  end
  if rec.dead ~= "" then redis.call("ZADD", dead, rec.dead, id) end
  if rec.paused == 1 then redis.call("SADD", paused, id) end
  if rec.static == 1 then redis.call("SADD", static, id) end
  return "restored"
end

for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  if op == "take" then
    out[#out + 1] = take(id, ARGV[i + 1])
  elseif op == "restore" then
    out[#out + 1] = restore(id, ARGV[i + 2])
  else
    redis.call("HDEL", moving, id)
    out[#out + 1] = "dropped"
  end
end
return out
