"""robots.txt (the worker checks a URL before fetching it) and the capacity planner."""

from __future__ import annotations

from dataclasses import dataclass

from celery_zsched.config.load import check_positive

#: RFC 9309 (2.5): crawlers must parse at least 500 KiB of a robots.txt.
ROBOTS_MAX_BYTES = 500 * 1024


@dataclass(frozen=True)
class RobotsSettings:
    """robots.txt ``Disallow`` and ``Crawl-delay`` (off by default), and the planner."""

    #: Check each job's URL against its host's robots.txt before the task runs:
    #: a disallowed URL is not fetched (``blocked_by_robots``), and with pacing on
    #: the host's ``Crawl-delay`` is a floor under its domain's delay.
    robots: bool = False
    #: How long a fetched robots.txt is used before it is fetched again (one fetch
    #: per host per this long, across every worker).
    robots_ttl_s: float = 86400.0
    #: How long a robots.txt that could not be fetched (5xx, 429, network error)
    #: is held so before it is tried again.
    robots_error_ttl_s: float = 900.0
    #: Connect and read timeout of a robots.txt fetch, and its whole duration.
    robots_timeout_s: float = 10.0
    #: Bytes of a robots.txt read; the rest is ignored (RFC 9309: at least 500 KiB).
    robots_max_bytes: int = ROBOTS_MAX_BYTES
    #: The user agent robots.txt groups are matched against, and sent with the fetch.
    robots_user_agent: str = "celery-zsched"
    #: A blocked job waits this long before its next try, unless it has a
    #: ``max_interval_s`` (then that).
    robots_block_s: float = 86400.0
    #: The capacity planner (``zsched domains``, the exporter) recomputes each
    #: domain's demand at most this often; between, every reader shares its last
    #: result from Redis.
    planner_refresh_s: float = 300.0

    def _check_robots(self) -> None:
        check_positive(self, "robots_ttl_s", "robots_error_ttl_s", "robots_timeout_s",
                       "robots_max_bytes", "robots_block_s", "planner_refresh_s")
