"""Which loopback address serves which fake site.

Pacing keys on the host of a job's URL, so one host would make the whole
demo one site, paced to one request a second. The sample jobs are spread over
several "sites" instead: every ``127.x.y.z`` address reaches this machine on
Linux, and each is a distinct domain to the scheduler. ``serve_targets``
listens on all of them; ``127.0.0.1`` stays the admin's (runserver).

Plain Python (no Django imports): ``make_sample_jobs.py`` imports it too.
"""

from __future__ import annotations

#: A site that answers every other request with 429 and ``Retry-After: 10``.
RATELIMITED_HOST = "127.0.0.2"
#: A site that is down (503, no ``Retry-After``) for a while, then recovers.
FLAKY_HOST = "127.0.0.3"
#: Healthy sites, sharing the feed, slow and broken pages between them. With
#: 1 s between requests per site, 24 of them serve the ~11 requests a second
#: the 1,000 sample jobs ask for, with room for the cron bursts on the minute.
FEED_HOSTS = tuple(f"127.0.0.{i}" for i in range(10, 34))
#: Every address ``serve_targets`` listens on.
TARGET_HOSTS = (RATELIMITED_HOST, FLAKY_HOST, *FEED_HOSTS)


def host_for(kind: str, n: int) -> str:
    """The host of job ``n`` fetching a ``kind`` target (``feed``, ``slow``, ``error``, ...)."""
    if kind == "ratelimited":
        return RATELIMITED_HOST
    if kind == "flaky":
        return FLAKY_HOST
    # A broken page among healthy ones: its site stays open (one failure in
    # twenty never reaches the breaker's ratio), only the page's job retries.
    return FEED_HOSTS[n % len(FEED_HOSTS)]
