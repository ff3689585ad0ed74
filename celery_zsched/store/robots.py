"""The robots.txt cache and the capacity planner's shared result, in Redis.

Both are kept in partition 0 (next to the domains' pacing state, which the
robots Crawl-delay feeds), and both let one process do the work for all: one
robots.txt fetch per origin per TTL, one planner scan per refresh period.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery_zsched.core.robots import Entry
from celery_zsched.store import scripts
from celery_zsched.store.base import StoreBase, time_ms, unavailable
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys

#: How an adaptive job's stored definition says so (see ``_definitions_page``).
_ADAPTIVE = '"recrawl":"adaptive"'


class SharedResults(StoreBase):
    """The robots.txt cache (``robots.lua``) and the planner's last result."""

    @unavailable
    def robots_get(self, origin: str, known_ms: int | None,
                   claim_ms: int) -> tuple[Entry | None, bool, int, bool]:
        """``origin``'s cached robots.txt: (entry, whether it is the one fetched at
        ``known_ms`` (then the entry is ``None``: not sent again), Redis' clock,
        whether the caller now holds the fetch, for ``claim_ms``).

        The caller holds the fetch only when the entry is missing or stale and no
        other claim is live; it must then :meth:`robots_put`.
        """
        raw, now, claimed = self._call(
            scripts.ROBOTS, self.keys, operation="get", origin=origin,
            entry="" if known_ms is None else known_ms, claim_or_domain=claim_ms,
            crawl_delay_ms="")
        same = raw == "same"
        entry = Entry.from_json(raw) if raw and not same else None
        return entry, same, int(now), bool(int(claimed))

    @unavailable
    def robots_put(self, origin: str, entry: Entry, domain: str | None,
                   crawl_delay_ms: int | None) -> int:
        """Store ``origin``'s fetched robots.txt, drop the fetch claim, and set the
        Crawl-delay of pacing ``domain`` (``None``: it has none). Redis' clock."""
        return int(self._call(
            scripts.ROBOTS, self.keys, operation="put", origin=origin, entry=entry.to_json(),
            claim_or_domain=domain or "",
            crawl_delay_ms="" if crawl_delay_ms is None else crawl_delay_ms))

    @unavailable
    def robots_forget(self, origin: str) -> None:
        """Drop ``origin``'s cached robots.txt (it is fetched again on next use)."""
        self.client.hdel(self.keys.robots, origin)
        self.client.hdel(self.keys.robots_claims, origin)

    # ---------------------------------------------------------------- planner
    @unavailable
    def planner_read(self) -> tuple[str | None, int]:
        """The planner's last result (JSON) and Redis' clock, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.planner)
        pipe.time()
        raw, now = pipe.execute()
        return (str(raw) if raw else None), time_ms(now)

    @unavailable
    def planner_claim(self, hold_ms: int) -> bool:
        """Claim the next planner scan for ``hold_ms``; ``False`` if another process holds it."""
        return bool(self.client.set(self.keys.planner_claim, "1", nx=True, px=hold_ms))

    @unavailable
    def planner_write(self, result: str) -> None:
        """Store the planner's result and release the claim."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.planner, result)
        pipe.delete(self.keys.planner_claim)
        pipe.execute()

    @unavailable
    def recrawl_mu_write(self, mus: dict[str, float]) -> None:
        """Store each domain's allocation multiplier in its home partition (where its
        jobs settle) and drop the multipliers of domains no longer in ``mus``."""
        homed: dict[int, dict[str, float]] = {i: {} for i in range(len(self.parts))}
        for domain, mu in mus.items():
            homed[self.layout.domain_home(domain)][domain] = mu
        for part, mine in homed.items():
            key = self.parts[part].recrawl_mu
            stale = [d for d in self.client.hkeys(key) if d not in mine]
            pipe = self.client.pipeline(transaction=False)
            if mine:
                pipe.hset(key, mapping={d: repr(mu) for d, mu in mine.items()})
            if stale:
                pipe.hdel(key, *stale)
            pipe.execute()

    def scan_definitions(self, count: int = 2000
                         ) -> Iterator[list[tuple[str, bool, str | None]]]:
        """Every partition's definitions as pages of (raw JSON, paused, runtime state),
        by HSCAN: constant memory. The state (raw, or ``None``) is read for adaptive
        jobs only, whose interval lives there: one HMGET per page, in the round trip
        of the paused flags. A job may come twice while Redis rehashes the hash
        (HSCAN's guarantee is "at least once"): the planner's sums are estimates anyway."""
        # A generator runs after a decorator would have returned: it guards itself.
        with redis_unavailable():
            if not self.layout_checked:
                self.check_layout()
            for keys in self.parts:
                cursor = 0
                while True:
                    cursor, page = self.client.hscan(keys.defs, cursor, count=count)
                    if page:
                        yield self._definitions_page(keys, page)
                    if not cursor:
                        break

    def _definitions_page(self, keys: Keys, page: dict[Any, Any]
                          ) -> list[tuple[str, bool, str | None]]:
        ids = list(page)
        # Job.to_json is compact and sorted: the substring is exact, and cheaper
        # than parsing every definition twice.
        adaptive = [i for i in ids if _ADAPTIVE in str(page[i])]
        pipe = self.client.pipeline(transaction=False)
        pipe.smismember(keys.paused, ids)
        if adaptive:
            pipe.hmget(keys.state, adaptive)
        flags, *rest = pipe.execute()
        states = dict(zip(adaptive, rest[0], strict=True)) if adaptive else {}
        return [(str(page[i]), bool(f), _text(states.get(i)))
                for i, f in zip(ids, flags, strict=True)]


def _text(raw: Any) -> str | None:
    return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)
