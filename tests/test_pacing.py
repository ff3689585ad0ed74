"""Per-domain pacing in the scripts, against a real Redis: gates, caps, AIMD, breaker."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.domains import domain_of, normalise_domain, registrable
from celery_zsched.core.errors import ConfigurationError, ValidationError
from celery_zsched.core.job import Job
from celery_zsched.core.results import Claimed
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store

Make = Callable[..., Store]


def _jobs(n: int, host: str = "a.example", **extra: Any) -> list[Job]:
    return [Job.from_dict({"url": f"http://{host}/p/{i}", "interval_s": 3600, "jitter_s": 0,
                           **extra}) for i in range(n)]


def _paced(make_store: Make, **overrides: Any) -> Store:
    # No start margin unless a test asks: these tests start requests back to back.
    return make_store(pacing=True, **{"domain_delay_s": 1.0, "domain_max_in_flight": 0,
                                      "domain_start_margin_s": 0.0, **overrides})


def _due_now(store: Store, jobs: list[Job]) -> None:
    store.upsert_many(jobs, stagger=False)
    now = store.now_ms()
    store.client.zadd(store.keys.schedule, {j.id: now - 10 for j in jobs})


def _state(store: Store, job_id: str) -> RuntimeState:
    return RuntimeState.from_wire(store.client.hget(store.keys.state, job_id))


def _complete(store: Store, c: Claimed, **kw: Any) -> None:
    assert store.start(c.job.id, c.occurrence, c.attempt).status == "ok"
    store.settle(c.job.id, c.occurrence, c.attempt, kw.pop("outcome", "complete"), **kw)


# ------------------------------------------------------------------ domains
def test_a_jobs_domain_is_its_lower_cased_idna_host_or_its_explicit_domain() -> None:
    assert domain_of("http://WWW.Example.COM:8080/x") == "www.example.com"
    assert domain_of("https://bücher.example/") == "xn--bcher-kva.example"
    assert domain_of("http://127.0.0.2:9000/") == "127.0.0.2"
    assert domain_of("http://[::1]:9000/") == "::1"
    assert domain_of("http://a.b.example.co.uk/", group_registrable=True) == "example.co.uk"
    assert domain_of("http://x.github.io/", group_registrable=True) == "x.github.io"
    assert domain_of("http://127.0.0.2/", group_registrable=True) == "127.0.0.2"
    assert domain_of("http://a.example/", "Shop.Example") == "shop.example"
    assert domain_of(None) is None
    assert registrable("localhost") == "localhost"
    with pytest.raises(ValueError, match="not a valid host name"):
        normalise_domain("bad..name")


def test_a_bad_explicit_domain_is_refused_naming_the_field_and_row() -> None:
    with pytest.raises(ValidationError) as err:
        Job.from_dict({"id": "j", "task": "t", "interval_s": 60, "domain": "a b"}, row=7)
    assert "domain" in str(err.value) and "7" in str(err.value)
    job = Job.from_dict({"id": "j", "task": "t", "interval_s": 60, "domain": "Shop.Example"})
    assert job.domain == "shop.example"
    assert Job.from_json(job.to_json()).domain == "shop.example"


def test_pacing_takes_any_partition_count_and_refuses_bad_values() -> None:
    def settings(**values: Any) -> Settings:
        return Settings.from_mapping({f"zsched_{k}": v for k, v in values.items()}, env={})

    assert settings(pacing=True, partitions=12).partitions == 12
    with pytest.raises(ConfigurationError, match="zsched_breaker_ratio"):
        settings(breaker_ratio=1.5)
    with pytest.raises(ConfigurationError, match="zsched_domain_delay_s"):
        settings(domain_delay_s=-1)
    with pytest.raises(ConfigurationError, match="zsched_domain_registrable must be true or false"):
        settings(domain_registrable="maybe")
    assert settings(pacing="yes", domain_delay_s="2.5").pacing_defaults.delay_ms == 2500


# --------------------------------------------------------------------- claim
def test_jobs_of_one_domain_due_together_are_spread_at_its_delay(make_store: Make) -> None:
    """One goes now; the others move, without a publish, to slots one delay apart."""
    store = _paced(make_store)
    jobs = _jobs(5)
    _due_now(store, jobs)
    before = {j.id: _state(store, j.id).occurrence for j in jobs}
    batch = store.claim()
    assert len(batch.jobs) == 1 and batch.held == 4
    slots = sorted(int(store.client.zscore(store.keys.schedule, j.id) or 0)
                   for j in jobs if j.id != batch.jobs[0].job.id)
    assert [b - a for a, b in itertools.pairwise(slots)] == [1000, 1000, 1000]
    assert slots[0] >= batch.now_ms + 1000 - 1
    assert store.client.zcard(store.keys.queued) == 1
    # Another domain is not held by this one.
    other = _jobs(1, host="b.example")
    _due_now(store, other)
    assert [c.job.id for c in store.claim().jobs] == [other[0].id]
    # A held job keeps its occurrence; it waits at its slot, so its wait is not lateness.
    held = next(j for j in jobs if j.id != batch.jobs[0].job.id)
    state = _state(store, held.id)
    # (Upsert, claim and the check can share one millisecond, so compare with the occurrence
    # read before the claim, not with the claim's clock.)
    assert state.status == "scheduled" and state.occurrence == before[held.id]
    assert state.occurrence <= batch.now_ms < (state.reserved_ms or 0)
    assert state.reserved_ms == store.client.zscore(store.keys.schedule, held.id)


def test_a_held_job_goes_at_its_slot_and_not_before(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0.3)
    jobs = _jobs(3)
    _due_now(store, jobs)
    first = store.claim()
    assert len(first.jobs) == 1
    starts = [first.now_ms]
    deadline = time.monotonic() + 5
    while len(starts) < 3 and time.monotonic() < deadline:
        batch = store.claim()
        starts += [batch.now_ms for _ in batch.jobs]
        time.sleep(0.02)
    assert len(starts) == 3
    assert all(b - a >= 300 for a, b in itertools.pairwise(starts)), starts
    assert all(b - a < 450 for a, b in itertools.pairwise(starts)), starts


def test_the_cap_holds_jobs_until_one_in_flight_settles(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, domain_max_in_flight=2)
    jobs = _jobs(4)
    _due_now(store, jobs)
    batch = store.claim()
    assert len(batch.jobs) == 2 and batch.held == 2
    assert store.domain("a.example").in_flight == 2
    _complete(store, batch.jobs[0])
    assert store.domain("a.example").in_flight == 1
    # Held for a cap re-check of 1 s (a zero delay must not spin).
    assert store.claim().jobs == []
    time.sleep(1.05)
    again = store.claim()
    assert len(again.jobs) == 1 and again.held == 1
    assert store.domain("a.example").in_flight == 2


def test_release_reap_and_a_deleted_job_all_free_the_in_flight_slot(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, lease_s=0.3, max_deliveries=5)
    jobs = _jobs(3)
    _due_now(store, jobs)
    a, b, c = store.claim().jobs
    assert store.domain("a.example").in_flight == 3
    store.release([a])
    assert store.domain("a.example").in_flight == 2
    assert store.start(b.job.id, b.occurrence, b.attempt).status == "ok"
    store.heartbeat([], worker="w", queues=())
    time.sleep(0.4)
    reaped = store.reap()
    assert reaped.redelivered == 1
    assert store.domain("a.example").in_flight == 1
    store.delete(c.job.id)
    store.settle(c.job.id, c.occurrence, c.attempt, "complete")
    assert store.domain("a.example").in_flight == 0
    # A second settle of the same occurrence moves nothing (compare-and-set).
    store.settle(c.job.id, c.occurrence, c.attempt, "complete")
    assert store.domain("a.example").in_flight == 0


# ---------------------------------------------------------------- adaptive
def test_retry_after_closes_the_domain_for_every_job(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0)
    jobs = _jobs(3)
    _due_now(store, jobs)
    first = store.claim().jobs
    assert len(first) == 3
    _complete(store, first[0], outcome="error", http_status=429, retry_after_s=10,
              error="HTTP 429")
    info = store.domain("a.example")
    assert info.closed_until_ms is not None
    assert 9_500 <= info.closed_until_ms - info.now_ms <= 10_000
    assert info.throttled and info.last_429_ms is not None and info.throttled_429 == 1
    # The two already claimed may not start: the gate is closed past a worker's wait.
    start = store.start(first[1].job.id, first[1].occurrence, first[1].attempt)
    assert start.status == "deferred" and start.until_ms is not None
    assert start.until_ms >= info.closed_until_ms
    assert store.client.zscore(store.keys.schedule, first[1].job.id) == start.until_ms
    assert _state(store, first[1].job.id).status == "scheduled"
    # A job falling due meanwhile is held to past the gate, not published.
    late = Job.from_dict({"url": "http://a.example/late", "interval_s": 3600, "jitter_s": 0})
    _due_now(store, [late])
    batch = store.claim()
    assert batch.jobs == [] and batch.held == 1
    assert (store.client.zscore(store.keys.schedule, late.id) or 0) >= info.closed_until_ms


def test_a_429_without_retry_after_multiplies_the_delay_and_successes_walk_it_back(
        make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=1.0, domain_backoff=2.0, domain_decrease_s=0.5,
                   domain_max_delay_s=3.0)
    jobs = _jobs(1)
    _due_now(store, jobs)

    def run(**kw: Any) -> float:
        now = store.now_ms()
        raw = store.client.hget(store.keys.domains, "a.example")
        # Open the gates so each step claims at once (this test is about the delay).
        rec = json.loads(raw or "{}")
        rec.update(L=0, S=0, R=0)
        store.client.hset(store.keys.domains, "a.example", json.dumps(rec))
        store.client.zadd(store.keys.schedule, {jobs[0].id: now - 1})
        (c,) = store.claim().jobs
        _complete(store, c, **kw)
        return store.domain("a.example").delay_s

    assert run(outcome="error", http_status=429) == 2.0
    assert run(outcome="error", http_status=429) == 3.0  # capped
    assert run(http_status=200) == 2.5
    assert run() == 2.0
    for _ in range(4):
        last = run()
    assert last == 1.0  # never below the base
    assert store.domain("a.example").base_delay_s == 1.0


# ---------------------------------------------------------------- breaker
def test_the_breaker_opens_holds_probes_once_and_closes(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, breaker_min_requests=4, breaker_ratio=0.5,
                   breaker_cooldown_s=0.5)
    jobs = _jobs(6)
    _due_now(store, jobs)
    batch = store.claim().jobs
    for c in batch[:4]:
        _complete(store, c, outcome="error", error="HTTP 500", http_status=500)
    info = store.domain("a.example")
    assert info.breaker == "open" and info.breaker_until_ms is not None
    # While open, nothing of the domain goes out and nothing is dead-lettered.
    now = store.now_ms()
    store.client.zadd(store.keys.schedule, {c.job.id: now - 1 for c in batch[:4]})
    held = store.claim()
    assert held.jobs == [] and held.held == 4
    assert store.client.zcard(store.keys.dead) == 0
    # After the cool-down: one probe, the others wait for its verdict.
    time.sleep(0.6)
    now = store.now_ms()
    store.client.zadd(store.keys.schedule, {c.job.id: now - 1 for c in batch[:4]})
    probe = store.claim()
    assert len(probe.jobs) == 1 and probe.held == 3
    assert store.domain("a.example").breaker == "half-open"
    _complete(store, probe.jobs[0], http_status=200)
    assert store.domain("a.example").breaker == "closed"


def test_a_failed_probe_opens_the_breaker_again(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, breaker_min_requests=2, breaker_cooldown_s=0.3)
    jobs = _jobs(3)
    _due_now(store, jobs)
    batch = store.claim().jobs
    for c in batch[:2]:
        _complete(store, c, outcome="error", error="boom")
    assert store.domain("a.example").breaker == "open"
    time.sleep(0.35)
    store.client.zadd(store.keys.schedule, {batch[0].job.id: store.now_ms() - 1})
    (probe,) = store.claim().jobs
    _complete(store, probe, outcome="error", error="still down")
    assert store.domain("a.example").breaker == "open"


# ---------------------------------------------------------------- start gate
def test_a_start_closer_than_the_delay_waits_for_the_gate(make_store: Make) -> None:
    """Claims are spaced, but broker waits differ: the start re-checks the spacing."""
    store = _paced(make_store, domain_delay_s=0.5, domain_start_margin_s=0.05)
    jobs = _jobs(2)
    _due_now(store, jobs)
    (a,) = store.claim().jobs
    time.sleep(0.52)
    (b,) = store.claim().jobs
    assert store.start(b.job.id, b.occurrence, b.attempt).status == "ok"
    wait = store.start(a.job.id, a.occurrence, a.attempt)
    # The start gate is the delay plus the margin after b's start.
    assert wait.status == "wait" and wait.until_ms is not None and 500 < wait.until_ms <= 550
    time.sleep(wait.until_ms / 1000)
    assert store.start(a.job.id, a.occurrence, a.attempt).status == "ok"


# ---------------------------------------------------------------- operators
def test_operators_override_and_reset_a_domain(make_store: Make) -> None:
    store = _paced(make_store)
    info = store.set_domain("A.Example", delay_s=2.5, max_in_flight=3, adaptive=False)
    assert (info.name, info.base_delay_s, info.max_in_flight, info.adaptive, info.overridden) \
        == ("a.example", 2.5, 3, False, True)
    with pytest.raises(ValueError, match="delay"):
        store.set_domain("a.example", delay_s=-1)
    assert store.set_domain("a.example", delay_s=0).base_delay_s == 0
    jobs = _jobs(2)
    _due_now(store, jobs)
    store.claim()
    assert store.domain("a.example").in_flight == 2
    assert [d.name for d in store.domains()] == ["a.example"]
    assert store.reset_domain("a.example") is True
    after = store.domain("a.example")
    assert not after.overridden and after.base_delay_s == 1.0 and after.in_flight == 2
    assert store.reset_domain("a.example") is False  # nothing left to drop
    assert "domains_throttled" in store.stats()


def test_jobs_stored_before_pacing_was_on_are_paced_after_a_refresh(make_store: Make) -> None:
    plain = make_store()
    jobs = _jobs(3)
    plain.upsert_many(jobs, stagger=False)
    dues = {j.id: plain.client.zscore(plain.keys.schedule, j.id) for j in jobs}
    assert _state(plain, jobs[0].id).domain is None
    paced = _paced(make_store, key_prefix=plain.settings.key_prefix)
    assert paced.refresh_domains() == 3
    assert {j.id: paced.client.zscore(paced.keys.schedule, j.id) for j in jobs} == dues
    assert {_state(paced, j.id).domain for j in jobs} == {"a.example"}
    paced.client.zadd(paced.keys.schedule, {j.id: paced.now_ms() - 1 for j in jobs})
    batch = paced.claim()
    assert len(batch.jobs) == 1 and batch.held == 2


def test_half_open_lets_exactly_one_request_start(make_store: Make) -> None:
    """A message claimed before the breaker opened does not start beside the probe."""
    store = _paced(make_store, domain_delay_s=0, breaker_min_requests=2, breaker_cooldown_s=0.3)
    jobs = _jobs(4)
    _due_now(store, jobs)
    first = store.claim().jobs
    for c in first[:2]:
        _complete(store, c, outcome="error", error="boom")
    stale = first[2]  # claimed before the breaker opened, still in the broker
    time.sleep(0.35)
    store.client.zadd(store.keys.schedule, {first[0].job.id: store.now_ms() - 1})
    (probe,) = store.claim().jobs
    late = store.start(stale.job.id, stale.occurrence, stale.attempt)
    assert late.status == "deferred"
    assert store.start(probe.job.id, probe.occurrence, probe.attempt).status == "ok"
    store.settle(probe.job.id, probe.occurrence, probe.attempt, "complete", http_status=200)
    assert store.domain("a.example").breaker == "closed"


def test_with_no_probe_chosen_the_first_start_after_the_cool_down_is_the_probe(
        make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, breaker_min_requests=2, breaker_cooldown_s=0.3)
    jobs = _jobs(4)
    _due_now(store, jobs)
    a, b, c, d = store.claim().jobs
    for failed in (a, b):
        _complete(store, failed, outcome="error", error="boom")
    time.sleep(0.35)
    assert store.start(c.job.id, c.occurrence, c.attempt).status == "ok"
    assert store.start(d.job.id, d.occurrence, d.attempt).status == "deferred"
    store.settle(c.job.id, c.occurrence, c.attempt, "error", error="still down")
    assert store.domain("a.example").breaker == "open"


def test_429s_slow_a_domain_down_but_never_open_its_breaker(make_store: Make) -> None:
    store = _paced(make_store, domain_delay_s=0, breaker_min_requests=2)
    jobs = _jobs(4)
    _due_now(store, jobs)
    batch = store.claim().jobs
    for c in batch:  # all running before the first 429 raises the delay
        assert store.start(c.job.id, c.occurrence, c.attempt).status == "ok"
    for c in batch:
        store.settle(c.job.id, c.occurrence, c.attempt, "error", error="HTTP 429",
                     http_status=429)
    info = store.domain("a.example")
    assert info.breaker == "closed" and info.throttled_429 == 4 and info.failed == 4
    assert info.delay_s > info.base_delay_s


def test_domains_list_ip_addresses_in_numeric_order(make_store: Make) -> None:
    store = _paced(make_store)
    for name in ("127.0.0.10", "b.example", "127.0.0.2", "a.example"):
        store.set_domain(name, delay_s=1)
    assert [d.name for d in store.domains()] == ["127.0.0.2", "127.0.0.10", "a.example",
                                                 "b.example"]


def test_jobs_held_by_the_cap_queue_up_one_delay_apart_instead_of_bunching(
        make_store: Make) -> None:
    """A full domain costs one hold per delay, not one per waiting job per second."""
    store = _paced(make_store, domain_delay_s=0.1, domain_max_in_flight=1)
    jobs = _jobs(5)
    _due_now(store, jobs)
    first = store.claim()
    assert len(first.jobs) == 1 and first.held == 4
    waiting = [j.id for j in jobs if j.id != first.jobs[0].job.id]

    def slots() -> list[int]:
        return sorted(int(store.client.zscore(store.keys.schedule, i) or 0) for i in waiting)

    assert [b - a for a, b in itertools.pairwise(slots())] == [100, 100, 100]
    time.sleep((slots()[-1] - store.now_ms()) / 1000 + 0.05)
    again = store.claim()  # the one in flight has not settled: all four wait again
    assert again.jobs == [] and again.held == 4
    later = slots()
    assert later[0] > first.now_ms + 1000
    assert [b - a for a, b in itertools.pairwise(later)] == [100, 100, 100]
