-- outbox_report.lua: record how the Django outbox stands, stamped with Redis' clock.
--
-- The outbox's sweeper (in beat) counts its database table after each sweep and
-- writes the counts here; ``zsched exporter`` reads them. ``at`` is Redis' clock,
-- so the exporter ages the oldest pending change on Redis' clock, not on a host's,
-- and a report that stops coming (no sweeper left) keeps ageing.
--
-- KEYS[1] outbox  hash  pending, dead, oldest_age_ms, at
-- ARGV[1] changes pending (not dead-lettered)
-- ARGV[2] changes dead-lettered
-- ARGV[3] age of the oldest pending change, ms (0: none pending)
-- Returns Redis' clock (ms) of the report
local now = now_ms()
redis.call("HSET", KEYS[1], "pending", ARGV[1], "dead", ARGV[2], "oldest_age_ms", ARGV[3],
           "at", now)
return now
