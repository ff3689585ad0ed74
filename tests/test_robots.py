"""robots.txt: what each answer means, the parser's edges, the shared cache (one fetch
per origin per TTL), the Crawl-delay floor under pacing and the blocked settle.

Real Redis (the throwaway server) and real HTTP (local sites on loopback
addresses of their own); nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from celery_zsched.core.job import Job
from celery_zsched.core.robots import (
    Entry,
    bounded_text,
    kind_of_status,
    origin_of,
    parse,
)
from celery_zsched.core.robots import _parse_stdlib as parse_stdlib
from celery_zsched.core.state import RuntimeState
from celery_zsched.metrics.exporter import StoreCollector
from celery_zsched.services.robots import RobotsGuard, fetch_robots
from celery_zsched.store import Store
from tests.robots_site import Routes, Site, serve_sites

Make = Callable[..., Store]
AGENT = "celery-zsched"
RULES = b"User-agent: *\nDisallow: /private/\nCrawl-delay: 3\n"


@pytest.fixture
def sites() -> Iterator[Callable[..., Site]]:
    yield from serve_sites()


def _robots(body: bytes, status: int = 200) -> Routes:
    return {"/robots.txt": (status, {"Content-Type": "text/plain"}, body)}


def _fetch(site: Site, **kw: Any) -> Any:
    return fetch_robots(site.url("/robots.txt"), timeout_s=kw.pop("timeout_s", 10.0),
                        max_bytes=kw.pop("max_bytes", 500 * 1024), agent=AGENT)


# ------------------------------------------------------------------ meanings
@pytest.mark.parametrize(("status", "kind"), [
    (200, "rules"), (204, "rules"), (301, "allow"), (400, "allow"), (401, "allow"),
    (403, "allow"), (404, "allow"), (410, "allow"), (429, "deny"), (500, "deny"),
    (503, "deny"), (599, "deny"), (100, "deny"),
])
def test_each_status_means_what_rfc_9309_says(status: int, kind: str) -> None:
    assert kind_of_status(status) == kind


def test_robots_txt_is_per_origin_scheme_host_and_port() -> None:
    assert origin_of("http://a.example/x?y") == "http://a.example"
    assert origin_of("http://a.example:80/x") == "http://a.example"
    assert origin_of("https://a.example:8443/x") == "https://a.example:8443"
    assert origin_of("http://[::1]:81/x") == "http://[::1]:81"
    assert origin_of("ftp://a.example/x") is None
    assert origin_of("http://a.example:99999/") is None
    assert origin_of("not a url") is None


def test_a_body_past_the_limit_is_cut_at_the_last_whole_line() -> None:
    body = b"User-agent: *\nDisallow: /a/\nDisallow: /private-area/\n"
    cut = bounded_text(body, len(body) - 5)  # inside the last line
    assert cut == "User-agent: *\nDisallow: /a/\n"
    assert bounded_text(b"\xef\xbb\xbfUser-agent: *\n\xff\n", 100).startswith("User-agent")


@pytest.mark.parametrize("body", [
    "<html><body>Not found</body></html>", "\x00\x01\x02garbage", "Disallow /nocolon\n",
    "Disallow: /private/\n",  # a rule outside any group applies to no one
    "Crawl-delay: 4\nUser-agent: *\nCrawl-delay: soon\n", "",
])
def test_a_malformed_body_allows_everything(body: str) -> None:
    for rules in (parse("rules", body, AGENT), parse_stdlib(body, AGENT)):
        assert rules.allowed("http://a.example/private/x")
        assert rules.crawl_delay_s is None


def test_rules_crawl_delay_and_request_rate_with_either_parser() -> None:
    body = ("User-agent: other\nDisallow: /\n\n"
            "User-agent: *\nDisallow: /private/\nAllow: /private/open\nCrawl-delay: 2\n"
            "Request-rate: 1/5\n")
    for rules in (parse("rules", body, AGENT), parse_stdlib(body, AGENT)):
        assert rules.allowed("http://a.example/public")
        assert not rules.allowed("http://a.example/private/x")
        assert rules.crawl_delay_s == 5.0  # 1 request per 5 s is longer than 2 s
    # protego: the longest match wins (RFC 9309 2.2.2), whatever the order.
    assert parse("rules", body, AGENT).allowed("http://a.example/private/open")
    assert not parse("rules", body, "other").allowed("http://a.example/public")
    assert parse("allow", "", AGENT).allowed("http://a.example/private/x")
    assert not parse("deny", "", AGENT).allowed("http://a.example/")


# ------------------------------------------------------------------- fetching
def test_a_fetch_reads_at_most_the_limit_of_an_oversized_robots_txt(
        sites: Callable[..., Site]) -> None:
    # 600 KiB: a rule in the first 500 KiB applies, one after it is never read.
    filler = b"# " + b"x" * 1000 + b"\n"
    body = b"User-agent: *\nDisallow: /early/\n" + filler * 600 + b"Disallow: /late/\n"
    site = sites(_robots(body))
    got = _fetch(site)
    assert got.status == 200 and len(got.body) == 500 * 1024 + 1
    rules = parse("rules", bounded_text(got.body, 500 * 1024), AGENT)
    assert not rules.allowed(site.url("/early/x"))
    assert rules.allowed(site.url("/late/x"))


def test_a_fetch_follows_five_redirects_and_gives_up_after_that(
        sites: Callable[..., Site]) -> None:
    def hop(n: int, last: int) -> Routes:
        routes: Routes = {
            f"/r{i}": (301, {"Location": f"/r{i + 1}"}, b"") for i in range(1, last)}
        routes["/robots.txt"] = (302, {"Location": "/r1"}, b"")
        routes[f"/r{last}"] = (200, {}, RULES)
        return routes
    five = sites(hop(5, 5))  # robots.txt -> r1 -> ... -> r5: five redirects
    assert _fetch(five).status == 200
    six = sites(hop(6, 6))
    got = _fetch(six)
    assert 300 <= got.status < 400 and kind_of_status(got.status) == "allow"


def test_5xx_and_an_unreachable_host_are_no_answer_and_4xx_is_none(
        sites: Callable[..., Site]) -> None:
    assert _fetch(sites(_robots(b"oops", 503))).status == 503
    assert _fetch(sites(_robots(b"", 404))).status == 404
    down = fetch_robots("http://127.0.1.250:9/robots.txt", timeout_s=2, max_bytes=10, agent=AGENT)
    assert down.status == 0 and down.error


def test_a_body_that_trickles_past_the_timeout_is_no_answer(sites: Callable[..., Site]) -> None:
    site = sites(_robots(RULES * 20))
    site.trickle_s = 0.2
    got = _fetch(site, timeout_s=0.5)
    assert got.status == 0 and "timed out" in got.error


# ----------------------------------------------------------- the shared cache
def _guard(store: Store, counter: list[str] | None = None) -> RobotsGuard:
    def fetch(url: str, **kw: Any) -> Any:
        if counter is not None:
            counter.append(url)
        return fetch_robots(url, **kw)
    return RobotsGuard(store, fetch)


def test_one_fetch_per_origin_per_ttl_across_processes(
        make_store: Make, sites: Callable[..., Site]) -> None:
    site = sites(_robots(RULES))
    first = make_store(robots=True)
    # Twelve "workers" (a guard each, on clients of their own) ask at once.
    stores = [Store(first.client, first.settings) for _ in range(12)]
    verdicts: list[bool] = []
    barrier = threading.Barrier(len(stores))

    def ask(store: Store) -> None:
        barrier.wait()
        verdicts.append(_guard(store).check(site.url("/private/a")).allowed)
        verdicts.append(_guard(store).check(site.url("/public")).allowed)
    threads = [threading.Thread(target=ask, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert site.count() == 1
    assert sorted(verdicts) == [False] * 12 + [True] * 12
    # Stale on Redis' clock: the next check fetches once more, and only once.
    entry = Entry.from_json(first.client.hget(first.keys.robots, site.origin))
    first.client.hset(first.keys.robots, site.origin, Entry(
        entry.kind, entry.body, entry.fetched_ms, first.now_ms() - 1).to_json())
    for store in stores[:3]:
        _guard(store).check(site.url("/x"))
    assert site.count() == 2


def test_a_fetch_is_cached_for_the_default_ttl_and_a_failure_for_the_error_ttl(
        make_store: Make, sites: Callable[..., Site]) -> None:
    store = make_store(robots=True)
    ok, bad = sites(_robots(RULES)), sites(_robots(b"", 500))
    _guard(store).check(ok.url("/"))
    verdict = _guard(store).check(bad.url("/"))
    now = store.now_ms()
    good = Entry.from_json(store.client.hget(store.keys.robots, ok.origin))
    failed = Entry.from_json(store.client.hget(store.keys.robots, bad.origin))
    assert good.kind == "rules" and abs(good.expires_ms - now - 86_400_000) < 5_000
    assert failed.kind == "deny" and abs(failed.expires_ms - now - 900_000) < 5_000
    assert failed.status == 500 and failed.error == "HTTP 500"
    # Unreachable, never read: everything is disallowed until the file is tried again.
    assert not verdict.allowed and verdict.reason == "unreachable"
    assert verdict.retry_s is not None and 890 <= verdict.retry_s <= 901


def test_an_unreachable_robots_txt_keeps_the_copy_read_before(
        make_store: Make, sites: Callable[..., Site]) -> None:
    answers = iter([(200, {}, RULES), (503, {}, b"")])
    site = sites({"/robots.txt": lambda _n: next(answers)})
    store = make_store(robots=True)
    assert not _guard(store).check(site.url("/private/x")).allowed
    entry = Entry.from_json(store.client.hget(store.keys.robots, site.origin))
    store.client.hset(store.keys.robots, site.origin, Entry(
        entry.kind, entry.body, entry.fetched_ms, store.now_ms() - 1).to_json())
    guard = _guard(store)
    assert guard.check(site.url("/public")).allowed
    assert not guard.check(site.url("/private/x")).allowed
    kept = Entry.from_json(store.client.hget(store.keys.robots, site.origin))
    assert (kept.kind, kept.status, kept.error) == ("rules", 503, "HTTP 503")
    assert site.count() == 2


def test_a_process_sends_the_body_once_and_then_asks_only_if_it_changed(
        make_store: Make, sites: Callable[..., Site]) -> None:
    store = make_store(robots=True)
    site = sites(_robots(RULES))
    guard = _guard(store)
    guard.check(site.url("/"))
    known = guard._known[site.origin]
    entry, same, _now, claimed = store.robots_get(site.origin, known.fetched_ms, 1000)
    assert (entry, same, claimed) == (None, True, False)


# ------------------------------------------------------- Crawl-delay and pacing
def test_crawl_delay_is_a_floor_under_the_domain_delay_and_an_override_wins(
        make_store: Make, sites: Callable[..., Site]) -> None:
    store = make_store(robots=True, pacing=True)
    site = sites(_robots(RULES))  # Crawl-delay: 3
    _guard(store).check(site.url("/"), site.host)
    info = store.domain(site.host)
    assert (info.base_delay_s, info.delay_source, info.robots_delay_s) == (3.0, "robots", 3.0)
    # The claim spaces the domain's jobs by the Crawl-delay, not the 1 s default.
    jobs = [Job.from_dict({"url": site.url(f"/p/{i}"), "interval_s": 3600, "jitter_s": 0})
            for i in range(2)]
    store.upsert_many(jobs, stagger=False)
    store.client.zadd(store.keys.schedule, {j.id: store.now_ms() - 10 for j in jobs})
    assert len(store.claim().jobs) == 1
    held = int(store.client.zrange(store.keys.schedule, 0, 0, withscores=True)[0][1])
    assert held - store.now_ms() > 2_500
    store.set_domain(site.host, delay_s=0.5)
    info = store.domain(site.host)
    assert (info.base_delay_s, info.delay_source) == (0.5, "override")
    # A reset drops the override; the site's Crawl-delay is not learned state: it stays.
    store.reset_domain(site.host)
    assert store.domain(site.host).delay_source == "robots"
    # Off, the floor is ignored (and a lower Crawl-delay never lowers the setting).
    off = Store(store.client, dataclasses.replace(store.settings, robots=False))
    assert off.domain(site.host).delay_source == "default"


def test_a_crawl_delay_below_the_configured_delay_changes_nothing(
        make_store: Make, sites: Callable[..., Site]) -> None:
    store = make_store(robots=True, pacing=True, domain_delay_s=5.0)
    site = sites(_robots(RULES))
    _guard(store).check(site.url("/"), site.host)
    info = store.domain(site.host)
    assert (info.base_delay_s, info.delay_source) == (5.0, "config")


# ------------------------------------------------------------- blocked settle
@pytest.mark.parametrize(("job", "wait_s", "expect_s"), [
    ({"interval_s": 300}, None, 86_400),
    ({"interval_s": 300}, 7_200, 7_200),
    ({"interval_s": 172_800}, None, 172_800),  # its own interval is longer than a day
])
def test_a_blocked_run_settles_blocked_by_robots_and_backs_off(
        make_store: Make, job: dict[str, Any], wait_s: float | None, expect_s: float) -> None:
    store = make_store()
    j = Job.from_dict({"url": "http://a.example/x", "jitter_s": 0, **job})
    store.upsert(j)
    store.client.zadd(store.keys.schedule, {j.id: store.now_ms() - 10})
    c = store.claim().jobs[0]
    assert store.start(c.job.id, c.occurrence, c.attempt).status == "ok"
    result = store.settle(c.job.id, c.occurrence, c.attempt, "blocked", retry_after_s=wait_s)
    now = store.now_ms()
    assert result.applied and result.label == "blocked_by_robots"
    assert result.next_due_ms is not None
    assert abs(result.next_due_ms - now - expect_s * 1000) < 2_000
    state = RuntimeState.from_wire(store.client.hget(store.keys.state, j.id))
    assert state.last_outcome == "blocked_by_robots"
    assert (state.runs, state.failures) == (0, 0)  # no request went out
    assert store.client.hget(store.keys.counters, "blocked_by_robots") == "1"
    # The exporter's settles counter has the outcome (the metrics extra is in dev).
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    exported = generate_latest(registry).decode()
    assert 'zsched_settles_total{outcome="blocked_by_robots"} 1.0' in exported
