-- notify.lua: the notifiers' rate limit and digest, shared by every process.
--
-- "gate" asks whether one notice may go out:
--   * "limited": its subject (event|job or event|domain) had a notice within
--     the per-subject window; nothing is sent;
--   * "send": send it now;
--   * "held": the digest window already counted more than the threshold of
--     notices: it is kept (capped list) for the window's digest.
-- "flush" only does the first step below.
-- Both first claim the digest of a window that has ended, if it held any
-- notice: the claim deletes the window, so exactly one caller gets it (and
-- sends the digest). A window opens at the first notice after the last one
-- closed, and lasts the digest window.
--
-- KEYS[1] notify_limits  zset  "event|subject" -> end of its rate limit, ms
-- KEYS[2] notify_digest  hash  s: window start ms, n: notices counted,
--                              h: notices held, h:<event>: held per event
-- KEYS[3] notify_held    list  held notices (JSON), oldest first, capped
-- ARGV[1] operation: gate | flush
-- ARGV[2] subject ("event|subject"; "" for flush)
-- ARGV[3] per-subject window, ms
-- ARGV[4] digest window, ms
-- ARGV[5] threshold: notices a window sends one by one before it holds them
-- ARGV[6] the notice (JSON; "" for flush)
-- ARGV[7] most held notices kept for one digest (the count stays exact)
-- ARGV[8] the notice's event name
-- Returns {verdict ("limited" | "send" | "held" | "flush"), end of the open
--          window that holds notices (ms, 0 = none), now, claimed digest
--          (JSON: start_ms, end_ms, count, by_event, notices) or ""}
local limits, digest, held = KEYS[1], KEYS[2], KEYS[3]
local op, subject = ARGV[1], ARGV[2]
local window_ms, digest_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local threshold, cap = tonumber(ARGV[5]), tonumber(ARGV[7])
local now = now_ms()

local function claim_closed()
  local start = tonumber(redis.call("HGET", digest, "s"))
  if not start or now < start + digest_ms then return "" end
  local fields = redis.call("HGETALL", digest)
  local count, by_event = 0, {}
  for i = 1, #fields, 2 do
    local name, value = fields[i], tonumber(fields[i + 1])
    if name == "h" then count = value
    elseif string.sub(name, 1, 2) == "h:" then by_event[string.sub(name, 3)] = value end
  end
  local notices = count > 0 and redis.call("LRANGE", held, 0, -1) or {}
  redis.call("DEL", digest, held)
  if count == 0 then return "" end
  return encode_json({start_ms = start, end_ms = start + digest_ms, count = count,
                      by_event = by_event, notices = notices})
end

local function open_end()
  local start = tonumber(redis.call("HGET", digest, "s"))
  local count = tonumber(redis.call("HGET", digest, "h") or "0")
  if start and count > 0 then return start + digest_ms end
  return 0
end

local claimed = claim_closed()
if op == "flush" then return {"flush", open_end(), now, claimed} end

redis.call("ZREMRANGEBYSCORE", limits, "-inf", now)
if redis.call("ZSCORE", limits, subject) then return {"limited", open_end(), now, claimed} end
redis.call("ZADD", limits, now + window_ms, subject)

-- No expiry: a window that held notices stays until someone claims its digest
-- (the sender that scheduled a flush at its end, or the next notice anywhere).
redis.call("HSETNX", digest, "s", now)
local counted = redis.call("HINCRBY", digest, "n", 1)
if counted <= threshold then return {"send", open_end(), now, claimed} end
redis.call("HINCRBY", digest, "h", 1)
redis.call("HINCRBY", digest, "h:" .. ARGV[8], 1)
if redis.call("RPUSH", held, ARGV[6]) > cap then redis.call("LTRIM", held, 0, cap - 1) end
return {"held", open_end(), now, claimed}
