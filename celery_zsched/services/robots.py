"""The robots.txt check a worker (or the job gateway) runs before a job's request.

One fetch per origin per ``zsched_robots_ttl_s`` across every process: the
store's ``robots.lua`` hands the fetch to exactly one caller (a claim that
expires), the others use the copy they have, or wait for the fetch. Each
process keeps the entries it parsed, and asks Redis only whether the one it
holds is still current (the body is sent again only when it changed).

What an answer means (RFC 9309, and where it leaves a choice, Google's rules):

- 2xx: the body's rules, the first ``zsched_robots_max_bytes`` (500 KiB) of it;
- 3xx: followed, five redirects at most; more, and the file is "unavailable";
- 4xx (but 429): unavailable, everything is allowed;
- 5xx, 429, timeouts and network errors: unreachable, everything is disallowed,
  retried after ``zsched_robots_error_ttl_s``; but a copy fetched before keeps
  being used meanwhile (RFC 9309 2.4 allows a cached copy while the file is
  unreachable).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from celery_zsched.core.robots import (
    MAX_REDIRECTS,
    Entry,
    bounded_text,
    kind_of_status,
    origin_of,
    parse,
    robots_url,
)
from celery_zsched.core.telemetry import log_event
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched")

#: Origins whose parsed robots.txt one process keeps.
KNOWN_MAX = 4096
#: How often a process waiting for another's fetch looks again (s).
POLL_S = 0.1
#: A fetch's claim lasts its timeout plus this (s): then another may take over.
CLAIM_SLACK_S = 5.0


@dataclass(frozen=True)
class Fetched:
    """What one ``GET /robots.txt`` found: the final status (0: no answer), the body
    read (2xx only) and, when it failed, why."""

    status: int
    body: bytes = b""
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    """May a URL be fetched? And, when it may not, when to ask again."""

    allowed: bool
    #: ``allowed``, ``disallowed`` (a rule), ``unreachable`` (no robots.txt could
    #: be read: RFC 9309's complete disallow) or ``unchecked`` (not an http(s) URL).
    reason: str
    #: The origin's Crawl-delay (s), if it has one.
    crawl_delay_s: float | None = None
    #: Blocked: seconds until asking again is worth it (``None``: the job's own
    #: backoff, ``max_interval_s`` or ``zsched_robots_block_s``).
    retry_s: float | None = None


class _NoMoreRedirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS


def fetch_robots(url: str, *, timeout_s: float, max_bytes: int, agent: str) -> Fetched:
    """``GET url``: at most ``max_bytes`` of its body, within ``timeout_s`` in all."""
    opener = urllib.request.build_opener(_NoMoreRedirects)
    request = urllib.request.Request(url, headers={"User-Agent": agent})
    deadline = time.monotonic() + timeout_s
    try:
        with opener.open(request, timeout=timeout_s) as response:
            chunks: list[bytes] = []
            size = 0
            # A body that trickles must not hold a worker past the timeout.
            while size <= max_bytes:
                if time.monotonic() > deadline:
                    return Fetched(0, error=f"timed out after {timeout_s:g}s reading the body")
                chunk = response.read(min(65536, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return Fetched(int(response.status), b"".join(chunks))
    except urllib.error.HTTPError as exc:
        # Too many redirects end here too, with the last 3xx status.
        return Fetched(int(exc.code), error=f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Fetched(0, error=f"{type(exc).__name__}: {reason}"[:200])


class RobotsGuard:
    """Checks URLs against their origin's robots.txt for one store (one per process)."""

    def __init__(self, store: Store,
                 fetch: Callable[..., Fetched] = fetch_robots) -> None:
        self.store = store
        self.settings = store.settings
        self.fetch = fetch
        self._known: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, url: str, domain: str | None = None) -> Verdict:
        """Whether ``url`` may be fetched; ``domain``: the pacing domain a fetch's
        Crawl-delay is recorded for (``None``: pacing off, or none)."""
        origin = origin_of(url)
        if origin is None:
            return Verdict(True, "unchecked")
        entry, now = self._entry(origin, domain)
        agent = self.settings.robots_user_agent
        rules = parse(entry.kind, entry.body, agent)
        if entry.kind == "deny":
            return Verdict(False, "unreachable", None,
                           max(1.0, (entry.expires_ms - now) / 1000))
        if rules.allowed(url):
            return Verdict(True, "allowed", rules.crawl_delay_s)
        return Verdict(False, "disallowed", rules.crawl_delay_s)

    # ------------------------------------------------------------- the cache
    def _entry(self, origin: str, domain: str | None) -> tuple[Entry, int]:
        """The entry to obey for ``origin``, and Redis' clock (fetching it if this
        process holds the claim, else waiting for the process that does)."""
        claim_s = self.settings.robots_timeout_s + CLAIM_SLACK_S
        give_up = time.monotonic() + 2 * claim_s
        while True:
            with self._lock:
                known = self._known.get(origin)
            entry, same, now, claimed = self.store.robots_get(
                origin, known.fetched_ms if known else None, round(claim_s * 1000))
            if same:
                entry = known
            if claimed:
                return self._refresh(origin, entry, now, domain), now
            if entry is not None:
                self._remember(origin, entry)
                return entry, now
            if time.monotonic() > give_up:  # a claim renewed forever: never expected
                return Entry("deny", "", now, now, error="robots.txt fetch never finished"), now
            time.sleep(POLL_S)

    def _refresh(self, origin: str, stale: Entry | None, now: int,
                 domain: str | None) -> Entry:
        s = self.settings
        started = time.monotonic()
        got = self.fetch(robots_url(origin), timeout_s=s.robots_timeout_s,
                         max_bytes=s.robots_max_bytes, agent=s.robots_user_agent)
        # Redis' clock, as the claim read it, plus the fetch's own time.
        at = now + int((time.monotonic() - started) * 1000)
        kind = kind_of_status(got.status) if got.status else "deny"
        if kind == "deny" and stale is not None and stale.kind != "deny":
            # Unreachable now, read before: keep obeying the copy we have.
            entry = Entry(stale.kind, stale.body, at, at + round(s.robots_error_ttl_s * 1000),
                          got.status, got.error or f"HTTP {got.status}")
        elif kind == "deny":
            entry = Entry("deny", "", at, at + round(s.robots_error_ttl_s * 1000),
                          got.status, got.error or f"HTTP {got.status}")
        else:
            body = bounded_text(got.body, s.robots_max_bytes) if kind == "rules" else ""
            entry = Entry(kind, body, at, at + round(s.robots_ttl_s * 1000), got.status)
        delay = parse(entry.kind, entry.body, s.robots_user_agent).crawl_delay_s
        # A Crawl-delay is a floor under pacing, capped like any learned delay.
        delay_ms = (None if delay is None
                    else round(min(delay, s.domain_max_delay_s) * 1000))
        self.store.robots_put(origin, entry, domain, delay_ms)
        self._remember(origin, entry)
        log_event("robots_fetched", origin=origin, status=got.status, kind=entry.kind,
                  crawl_delay_s=delay, error=entry.error or None, bytes=len(got.body))
        return entry

    def _remember(self, origin: str, entry: Entry) -> None:
        with self._lock:
            self._known[origin] = entry
            self._known.move_to_end(origin)
            while len(self._known) > KNOWN_MAX:
                self._known.popitem(last=False)
