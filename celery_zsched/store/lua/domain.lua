-- domain.lua: an operator changes one domain's pacing (CLI, Django admin).
--
-- Runs as one script so it never races a claim or a settle that is updating
-- the same domain. A reset forgets what was learned (adaptive delay,
-- Retry-After gate, breaker, counts) and the overrides, but keeps the live
-- accounting (in flight, last grant and start, reserved slots): forgetting
-- those would let the next claim exceed the cap or the delay.
--
-- KEYS[1] domains      hash  domain -> learned pacing state (cjson)
-- KEYS[2] domain_conf  hash  domain -> operator overrides (cjson)
-- ARGV[1] operation: set | reset
-- ARGV[2] domain
-- ARGV[3] set: the overrides to change, JSON ({"delay": ms, "cap": n,
--         "adaptive": bool}; a null removes one); reset: ""
-- Returns 1 when there was an override or something learned to drop, else 0
local domains, conf_key = KEYS[1], KEYS[2]
local op, name = ARGV[1], ARGV[2]

if op == "set" then
  local raw = redis.call("HGET", conf_key, name)
  local conf = raw and decode_json(raw) or {}
  for k, v in pairs(decode_json(ARGV[3])) do
    if is_json_null(v) then conf[k] = nil else conf[k] = v end
  end
  if next(conf) == nil then
    redis.call("HDEL", conf_key, name)
  else
    redis.call("HSET", conf_key, name, encode_json(conf))
  end
  return 1
end

local changed = redis.call("HDEL", conf_key, name)
local raw = redis.call("HGET", domains, name)
if not raw then return changed end
local s = decode_json(raw)
-- The robots.txt Crawl-delay is the site's word, not something learned: kept.
local kept = {n = s.n, L = s.L, S = s.S, R = s.R, rd = s.rd}
for k in pairs(s) do
  if kept[k] == nil then changed = 1 end
end
if next(kept) == nil then
  redis.call("HDEL", domains, name)
else
  redis.call("HSET", domains, name, encode_json(kept))
end
return changed
