-- robots.lua: the robots.txt cache, one fetch per origin per TTL across workers.
--
-- "get" reads an origin's entry and, when it is missing or stale and nobody is
-- fetching it, claims the fetch for the caller: the claim and the read are one
-- step, so two workers can never both decide to fetch. "put" stores a fetch's
-- entry, drops the claim, sets the Crawl-delay of the job's pacing domain
-- (``rd`` in its learned state; see _prelude.lua) and restamps its last start
-- (``S``), in the same step.
--
-- KEYS[1] robots         hash  origin -> entry JSON (k kind, b body, t fetched ms,
--                              x expires ms, s status, e error)
-- KEYS[2] robots_claims  hash  origin -> claim deadline ms
-- KEYS[3] domains        hash  domain -> learned pacing state (cjson)
-- ARGV[1] operation: get | put
-- ARGV[2] origin
-- ARGV[3] get: fetched ms of the entry the caller has parsed already ("" = none):
--         the body is not sent again; put: the entry JSON
-- ARGV[4] get: how long a claim lasts (ms); put: the pacing domain ("" = none:
--         pacing is off)
-- ARGV[5] put: the Crawl-delay (ms) to set on it ("" = none: the domain has none)
-- Returns get: {entry JSON | "" | "same", now ms, 1 if the caller must fetch else 0};
--         put: now ms
local robots, claims, domains = KEYS[1], KEYS[2], KEYS[3]
local op, origin = ARGV[1], ARGV[2]
local now = now_ms()

if op == "put" then
  redis.call("HSET", robots, origin, ARGV[3])
  redis.call("HDEL", claims, origin)
  local name = ARGV[4]
  if name ~= "" then
    local raw = redis.call("HGET", domains, name)
    local rec = raw and decode_json(raw) or {}
    rec.rd = tonumber(ARGV[5])
    -- The robots.txt request took the start slot of the job it was fetched
    -- for, whose own request follows now: the domain's next start is a delay
    -- after this one, not after the slot's start (start.lua reads S).
    rec.S = math.max(tonumber(rec.S) or 0, now)
    redis.call("HSET", domains, name, encode_json(rec))
  end
  return now
end

local raw = redis.call("HGET", robots, origin)
local fresh, known = false, false
if raw then
  local entry = decode_json(raw)
  fresh = tonumber(entry.x) > now
  known = ARGV[3] ~= "" and tonumber(entry.t) == tonumber(ARGV[3])
end
local reply = raw or ""
if known then reply = "same" end
if fresh then return {reply, now, 0} end
local until_ms = tonumber(redis.call("HGET", claims, origin) or 0)
if until_ms > now then return {reply, now, 0} end
redis.call("HSET", claims, origin, now + tonumber(ARGV[4]))
return {reply, now, 1}
