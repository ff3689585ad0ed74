"""The store-level listing behind ``GET /v1/jobs``: filters, cursor pages, bounded work.

Every check compares a walk with a brute-force filter over all the jobs, read
one by one through ``Store.get_many``, on a real Redis.
"""

from __future__ import annotations

import base64
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.domains import domain_of
from celery_zsched.core.errors import StoreUnavailable, ValidationError
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from celery_zsched.store.listing import JobFilter, Page, _encode, _Position, list_page
from tests.dead_letters import dead_job, kill

HOSTS = ("a.example", "B.Example", "sub.c.example")
QUEUES = (None, "eu", "us")


@dataclass(frozen=True)
class Spec:
    """What the test knows of a job it made, independently of the code under test."""

    kind: str
    queue: str
    domain: str | None
    transport: str


def make_job(i: int) -> tuple[Job, Spec]:
    """Job ``i`` of a mixed fleet: every kind, queue, domain source and transport."""
    kind = ("interval", "cron", "once")[i % 3]
    queue = QUEUES[i // 3 % 3]
    transport = "http" if i % 7 == 0 else "celery"
    data: dict[str, Any] = {"id": f"j{i:05d}", "task": "tests.noop", "jitter_s": 0,
                            "transport": transport, "queue": queue}
    domain: str | None = None
    if i % 5 != 4:  # one in five has no URL: no domain, unless an explicit one
        host = HOSTS[i // 2 % len(HOSTS)]
        data["url"] = f"https://{host}/{i}"
        domain = host.lower()
    if i % 11 == 0:
        data["domain"] = "Explicit.Example"
        domain = "explicit.example"
    if kind == "interval":
        data["interval_s"] = 3600
    elif kind == "cron":
        data["cron"] = "*/5 * * * *"
    else:
        data["run_at"] = 4_000_000_000  # epoch s, far off: never due here
    return Job.from_dict(data), Spec(kind, queue or "", domain, transport)


def fleet(store: Store, count: int) -> dict[str, Spec]:
    """Store ``count`` mixed jobs; what each one is, by id."""
    made = [make_job(i) for i in range(count)]
    store.upsert_many([job for job, _ in made], stagger=False)
    return {job.id: spec for job, spec in made}


def walk(store: Store, flt: JobFilter, limit: int, **kwargs: Any) -> list[Page]:
    """Every page of one walk (fails if it does not end within a generous bound)."""
    pages: list[Page] = []
    cursor: str | None = None
    for _ in range(100_000):
        page = list_page(store, flt, limit=limit, cursor=cursor, **kwargs)
        pages.append(page)
        assert len(page.items) <= limit
        ids = [info.job.id for info in page.items]
        assert len(ids) == len(set(ids)), "a job twice on one page"
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor
    raise AssertionError("the walk did not end")


def finish_rehash(store: Store, ids: list[str]) -> None:
    """Let every definitions hash finish the rehash its last growth started.

    Redis rehashes a hash one bucket per lookup, so one that grew keeps
    rehashing while it is walked (the walk's own lookups step it), and HSCAN
    may then return a job twice: the one duplication a walk allows. One
    lookup per job is more steps than any rehash of them needs.
    """
    store.get_many(ids)


def walked_ids(pages: list[Page]) -> list[str]:
    return [info.job.id for page in pages for info in page.items]


def brute_force(store: Store, specs: dict[str, Spec], flt: JobFilter) -> set[str]:
    """The ids ``flt`` keeps, by the test's own reading of every job (which also
    finishes any rehash: see :func:`finish_rehash`)."""
    infos = dict(zip(specs, store.get_many(list(specs)), strict=True))
    out = set()
    for job_id, spec in specs.items():
        info = infos[job_id]
        assert info is not None
        if ((flt.status is None or info.status == flt.status)
                and (flt.kind is None or spec.kind == flt.kind)
                and (flt.queue is None or spec.queue == flt.queue)
                and (flt.domain is None or spec.domain == flt.domain)
                and (flt.transport is None or spec.transport == flt.transport)):
            out.add(job_id)
    return out


@pytest.fixture
def statuses(make_store: Callable[..., Store]) -> Iterator[tuple[Store, dict[str, Spec]]]:
    """Four partitions, 600 mixed jobs in every status: scheduled, queued, running,
    finished, paused (and paused while running), dead."""
    store = make_store(partitions=4, lease_s=0.2, max_deliveries=1)
    dead = [dead_job(f"dead{i:02d}", jitter_s=0) for i in range(12)]
    kill(store, dead)
    specs = fleet(store, 600)
    for job in dead:
        specs[job.id] = Spec("interval", "", "example.test", "celery")
    now = store.now_ms()
    once = [Job.from_dict({"id": f"once{i}", "task": "tests.noop", "run_at": now // 1000 - 1})
            for i in range(6)]
    store.upsert_many(once, stagger=False)
    specs.update({job.id: Spec("once", "", None, "celery") for job in once})
    claimed = [c for _ in range(8) for c in store.claim(1000).jobs]
    assert len(claimed) > 100  # every due celery interval job and the once jobs
    started = [c for c in claimed if c.job.id.startswith("once") or int(c.job.id[1:]) % 4 == 0]
    for c in started:
        assert store.start(c.job.id, c.occurrence, c.attempt).runs
    for c in started:
        if c.job.id.startswith("once"):
            assert store.settle(c.job.id, c.occurrence, c.attempt, "complete").applied
    store.pause(*[f"j{i:05d}" for i in range(0, 600, 8)])  # some of them running
    yield store, specs


def test_every_status_occurs_in_the_fixture(statuses: tuple[Store, dict[str, Spec]]) -> None:
    store, specs = statuses
    infos = store.get_many(list(specs))
    seen = Counter(info.status for info in infos if info is not None)
    assert set(seen) == {"scheduled", "queued", "running", "paused", "dead", "finished"}, seen
    # A paused job that was running keeps its status: status=paused must leave it out.
    assert any(info.paused and info.status == "running" for info in infos if info)


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("limit", [1, 7, 100])
def test_unfiltered_pages_return_every_job_exactly_once(
        make_store: Callable[..., Store], partitions: int, limit: int) -> None:
    store = make_store(partitions=partitions)
    specs = fleet(store, 1000)
    finish_rehash(store, list(specs))
    pages = walk(store, JobFilter(), limit)
    ids = walked_ids(pages)
    assert sorted(ids) == sorted(specs)  # every job, none twice
    assert all(len(page.items) == limit for page in pages[:-1]), "unfiltered pages are full"


FILTERS = [
    JobFilter(kind="cron"), JobFilter(kind="once"), JobFilter(kind="interval"),
    JobFilter(queue=""), JobFilter(queue="eu"), JobFilter(queue="nowhere"),
    JobFilter(domain="b.example"), JobFilter(domain="EXPLICIT.example."),
    JobFilter(transport="http"), JobFilter(transport="celery"),
    JobFilter(kind="interval", queue="us", transport="celery"),
    JobFilter(kind="cron", domain="sub.c.example", queue=""),
] + [JobFilter(status=s) for s in
     ("scheduled", "queued", "running", "paused", "dead", "finished")] + [
    JobFilter(status="finished", kind="once"), JobFilter(status="running", kind="interval"),
    JobFilter(status="paused", queue="eu"),
    JobFilter(status="queued", domain="a.example", transport="celery"),
    JobFilter(status="dead", kind="cron"),
]
#: Filters that keep no job of the fixture, on purpose.
EMPTY = [JobFilter(queue="nowhere"), JobFilter(status="dead", kind="cron")]


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: repr(f)[10:-1])
def test_each_filter_and_combination_matches_a_brute_force_filter(
        statuses: tuple[Store, dict[str, Spec]], flt: JobFilter) -> None:
    store, specs = statuses
    expected = brute_force(store, specs, flt)
    for limit in (3, 50):
        ids = walked_ids(walk(store, flt, limit))
        assert sorted(ids) == sorted(expected)
    if flt not in EMPTY:
        assert expected, "a filter that keeps nothing proves little"


def test_pages_resume_inside_a_batch_a_scan_returns_whole(
        make_store: Callable[..., Store]) -> None:
    # Forty dead letters fit a listpack: ZSCAN returns all of them in one call
    # whatever COUNT is, so pages of three must stop inside that batch.
    store = make_store(lease_s=0.2, max_deliveries=1)
    dead = [dead_job(f"d{i:02d}") for i in range(40)]
    kill(store, dead)
    assert store.client.object("encoding", store.keys.dead) == "listpack"
    pages = walk(store, JobFilter(status="dead"), 3)
    assert [len(p.items) for p in pages] == [3] * 13 + [1]
    assert walked_ids(pages) == sorted(job.id for job in dead)


def test_a_small_budget_bounds_each_call_and_still_walks_everything(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=4)
    specs = fleet(store, 400)
    flt = JobFilter(domain="explicit.example")
    expected = brute_force(store, specs, flt)
    pages = walk(store, flt, 100, budget=5)
    assert sorted(walked_ids(pages)) == sorted(expected)
    # At most five rows examined a call: at least 400 / 5 calls, most of them
    # empty pages that still carry a cursor.
    assert len(pages) >= 80
    assert sum(1 for p in pages[:-1] if not p.items) > 40


def test_budget_one_makes_progress_one_row_at_a_time(store: Store) -> None:
    specs = fleet(store, 30)
    finish_rehash(store, list(specs))
    pages = walk(store, JobFilter(), 10, budget=1)
    assert sorted(walked_ids(pages)) == sorted(specs)
    assert all(len(p.items) <= 1 for p in pages)


def test_an_empty_store_is_one_empty_page(make_store: Callable[..., Store]) -> None:
    for partitions in (1, 3):
        page = list_page(make_store(partitions=partitions), JobFilter(), limit=10)
        assert page == Page([], None)


def test_a_walk_during_adds_and_deletes_returns_every_job_that_stayed(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=4)
    specs = fleet(store, 2000)
    doomed = sorted(specs)[::3]
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            # Adds grow each partition's hash through resizes (rehashing) while it is walked.
            for n in itertools.count(2000):
                if stop.is_set() or n >= 12_000:
                    return
                store.upsert_many([make_job(i)[0] for i in range(n, n + 50)], stagger=False)
                if doomed:
                    store.delete(*[doomed.pop() for _ in range(min(10, len(doomed)))])
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        ids = walked_ids(walk(store, JobFilter(), 7))
    finally:
        stop.set()
        thread.join()
    assert not errors
    stayed = set(specs) - set(sorted(specs)[::3])
    assert stayed <= set(ids)
    added = [i for i in ids if i not in specs]
    assert added, "the churn ran during the walk"


def test_a_page_never_holds_more_than_its_limit_with_a_status_filter(
        statuses: tuple[Store, dict[str, Spec]]) -> None:
    store, _ = statuses
    for limit in (1, 2, 5):
        pages = walk(store, JobFilter(status="scheduled"), limit)
        assert max(len(p.items) for p in pages) == limit


def cursor_of(store: Store, flt: JobFilter) -> str:
    page = list_page(store, flt, limit=2)
    assert page.next_cursor is not None
    return page.next_cursor


@pytest.mark.parametrize("garbage", [
    "", "!!!", "not a cursor", "AAAA", "x" * 5000, base64.urlsafe_b64encode(b"[1,2]").decode()])
def test_a_garbage_cursor_is_a_validation_error_naming_the_cursor(
        store: Store, garbage: str) -> None:
    fleet(store, 5)
    with pytest.raises(ValidationError) as caught:
        list_page(store, JobFilter(), cursor=garbage)
    assert caught.value.field == "cursor"


def test_a_tampered_cursor_is_refused(store: Store) -> None:
    fleet(store, 10)
    cursor = cursor_of(store, JobFilter())
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    for at in (0, len(raw) // 2, len(raw) - 2):
        bent = bytearray(raw)
        bent[at] ^= 0x01
        text = base64.urlsafe_b64encode(bytes(bent)).decode().rstrip("=")
        with pytest.raises(ValidationError) as caught:
            list_page(store, JobFilter(), limit=2, cursor=text)
        assert caught.value.field == "cursor"
    assert list_page(store, JobFilter(), limit=2, cursor=cursor).items  # the real one works


def test_a_cursor_of_another_filter_or_layout_or_partition_is_refused(
        make_store: Callable[..., Store]) -> None:
    four = make_store(partitions=4)
    fleet(four, 20)
    cursor = cursor_of(four, JobFilter(kind="cron"))
    one = make_store()
    fleet(one, 20)
    cases: list[tuple[Store, JobFilter, str]] = [
        (four, JobFilter(kind="once"), cursor),
        (four, JobFilter(), cursor),
        (one, JobFilter(kind="cron"), cursor),  # made for four partitions
        (four, JobFilter(), _encode(_Position(part=4), 4, JobFilter())),  # no partition 4
        (four, JobFilter(), _encode(_Position(part=1, start=2 ** 64), 4, JobFilter())),
    ]
    for store, flt, text in cases:
        with pytest.raises(ValidationError) as caught:
            list_page(store, flt, limit=2, cursor=text)
        assert caught.value.field == "cursor", (flt, caught.value)


@pytest.mark.parametrize(("field", "value"), [
    ("status", "sleeping"), ("status", "PAUSED"), ("kind", "weekly"), ("transport", "smtp"),
    ("queue", "q" * 201), ("queue", 7), ("domain", ""), ("domain", "bad domain!"),
    ("domain", 3)])
def test_a_bad_filter_value_is_a_validation_error_naming_its_field(
        field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        JobFilter(**{field: value})
    assert caught.value.field == field


@pytest.mark.parametrize(("field", "value"), [
    ("limit", 0), ("limit", 1001), ("limit", "5"), ("limit", True), ("budget", 0),
    ("budget", -3)])
def test_a_bad_limit_or_budget_is_a_validation_error_naming_it(
        store: Store, field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        list_page(store, JobFilter(), **{field: value})
    assert caught.value.field == field


def test_the_domain_filter_is_normalised() -> None:
    assert JobFilter(domain=" Sub.C.Example. ").domain == "sub.c.example"


def test_a_down_redis_is_store_unavailable(make_settings: Callable[..., Settings]) -> None:
    down = Store.from_settings(make_settings(redis_url="redis://127.0.0.1:1/0"))
    with pytest.raises(StoreUnavailable):
        list_page(down, JobFilter(), limit=5)


@pytest.mark.parametrize(("url", "registrable", "domain", "kept"), [
    ("https://www.news.example.co.uk/a", True, "example.co.uk", True),
    ("https://www.news.example.co.uk/a", False, "example.co.uk", False),
    ("https://www.news.example.co.uk/a", False, "www.news.example.co.uk", True),
    ("https://WWW.Example.ORG./a", False, "www.example.org", True),
    ("https://bücher.example/a", False, "xn--bcher-kva.example", True),
    ("https://shop.bücher.de/a", True, "xn--bcher-kva.de", True),
    ("http://[0:0::1]:8080/a", False, "::1", True),
    ("http://127.0.0.1:8080/a", False, "127.0.0.1", True),
    ("https://notexample.org/a", True, "example.org", False),
    ("https://example.org.evil.test/a", True, "example.org", False),
])
def test_the_domain_filter_matches_each_host_shape_as_pacing_keys_it(
        make_store: Callable[..., Store], url: str, registrable: bool, domain: str,
        kept: bool) -> None:
    store = make_store(domain_registrable=registrable)
    store.upsert(Job.from_dict({"id": "j", "url": url}))
    listed = walked_ids(walk(store, JobFilter(domain=domain), limit=10))
    assert (listed == ["j"]) is kept
    # The same key the pacing uses, whatever path the filter took to it.
    assert (domain_of(url, group_registrable=registrable) == domain) is kept
