"""robots.txt end to end: real beat, two prefork workers, local sites as domains.

Every site listens on a loopback address of its own and counts each request
it gets, robots.txt included: the assertions are about what reached the
sites, not about what the scheduler believes it did. Default settings
(``zsched_robots_ttl_s`` one day: the whole test is inside one TTL, so one
fetch per site, ever).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from celery_zsched.core.state import RuntimeState
from e2e.conftest import Deployment, log_events
from tests.robots_site import Routes, Site, serve_sites

pytestmark = pytest.mark.slow

#: From a worker's start (start.lua stamps the domain's last start on Redis'
#: clock) to the request at the site's socket (see test_pacing.START_TO_SOCKET_S).
START_TO_SOCKET_S = 0.150
POOL, PROCESSES = "prefork", 2


@pytest.fixture
def sites() -> Iterator[Callable[..., Site]]:
    yield from serve_sites()


def _robots(body: bytes, status: int = 200) -> Routes:
    return {"/robots.txt": (status, {"Content-Type": "text/plain"}, body)}


def _add(d: Deployment, site: Site, paths: list[str], interval_s: float) -> list[str]:
    jobs = [d.job(url=site.url(p), interval_s=interval_s, jitter_s=0) for p in paths]
    d.store.upsert_many(jobs, stagger=False)
    return [j.id for j in jobs]


def _state(d: Deployment, job_id: str) -> RuntimeState:
    return d.info(job_id).state


def test_robots_disallow_and_crawl_delay_with_one_fetch_per_site_across_two_workers(
        deploy: Callable[..., Deployment], sites: Callable[..., Site]) -> None:
    """Four sites, one beat, two prefork workers (two processes each).

    - ``polite``: ``Disallow: /private/`` and ``Crawl-delay: 2``: its private
      pages are never requested (their jobs settle ``blocked_by_robots`` and wait
      a day), its public pages arrive at least 2 s apart (not the default 1 s),
      and ``zsched domains`` says the delay comes from robots;
    - ``open``: no robots.txt (404): everything is fetched;
    - ``down``: robots.txt answers 500: nothing is fetched, the jobs wait until
      the file is tried again (``zsched_robots_error_ttl_s``);
    - ``crowd``: no delay and no cap (an override), eight jobs due at once, so
      the four processes check its robots.txt at the same moment.

    Each site's robots.txt is requested exactly once.
    """
    d = deploy(pacing=True, robots=True)
    polite = sites(_robots(b"User-agent: *\nDisallow: /private/\nCrawl-delay: 2\n"))
    open_ = sites(_robots(b"", 404))
    down = sites(_robots(b"oops", 500))
    crowd = sites(_robots(b"User-agent: *\nDisallow: /no/\n"))
    public = _add(d, polite, [f"/pub/{i}" for i in range(3)], 1)
    private = _add(d, polite, ["/private/a", "/private/b"], 60)
    _add(d, open_, [f"/p/{i}" for i in range(3)], 1)
    blocked_down = _add(d, down, ["/a", "/b"], 60)
    d.store.set_domain(crowd.host, delay_s=0, max_in_flight=0)
    crowd_jobs = _add(d, crowd, [f"/c/{i}" for i in range(8)], 3600)
    d.start_beat()
    for name in ("w1", "w2"):
        d.start_worker(name, pool=POOL, concurrency=PROCESSES)

    d.wait_for(lambda: len(polite.times("/pub/")) >= 6 and len(open_.times("/p/")) >= 6
               and len(crowd.times("/c/")) == 8, 120, "pages fetched at every allowed site")
    d.wait_for(lambda: all(_state(d, j).last_outcome == "blocked_by_robots"
                           for j in [*private, *blocked_down]), 60, "the blocked jobs settled")

    # One robots.txt fetch per site, across both workers and all their processes.
    assert [s.count("/robots.txt") for s in (polite, open_, down, crowd)] == [1, 1, 1, 1]
    fetched = [e for w in d.procs if w.name in ("w1", "w2")
               for e in log_events(w.text(), "robots_fetched")]
    assert sorted(e["origin"] for e in fetched) == sorted(
        s.origin for s in (polite, open_, down, crowd))
    # Disallowed and unreachable: never requested.
    assert polite.times("/private/") == [] and down.times("/a") + down.times("/b") == []
    # Crawl-delay 2 s is the floor under the default 1 s delay.
    arrivals = polite.times("/pub/")
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 2.0 - START_TO_SOCKET_S, gaps
    info = d.store.domain(polite.host)
    assert (info.delay_source, info.base_delay_s, info.robots_delay_s) == ("robots", 2.0, 2.0)
    assert d.store.domain(open_.host).delay_source == "default"
    # The blocked jobs wait: a day (no max_interval_s), or until robots.txt is retried.
    now = d.store.now_ms()
    for job_id in private:
        due = d.info(job_id).due_ms
        assert due is not None and 86_400_000 - 60_000 < due - now <= 86_400_000
        assert _state(d, job_id).runs == 0
    for job_id in blocked_down:
        due = d.info(job_id).due_ms
        assert due is not None and 900_000 - 60_000 < due - now <= 900_000
    assert all(_state(d, j).last_outcome == "complete" for j in [*public, *crowd_jobs])
    counters = d.store.client.hget(d.store.keys.counters, "blocked_by_robots")
    assert int(counters or 0) >= 4
