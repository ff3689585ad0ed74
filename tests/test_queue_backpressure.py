"""Backpressure per queue, with a total cap: the claim's per-queue accounting, against Redis.

Each queue may hold ``queue_max_queued`` occurrences published and not started;
a due job of a queue at its bound is held back in the schedule (past
``PARK_BASE``, its due time kept) and the claim goes on with the other queues'
jobs. Every path that takes an occurrence out of ``queued`` must take it out of
the count of the queue it was counted in: each test compares the counts with
the set they count.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.job import Job
from celery_zsched.metrics.exporter import serve
from celery_zsched.store import Claimed, Store
from celery_zsched.store.keys import PARK_BASE, Keys
from celery_zsched.store.repartition import repartition
from tests.cli_env import ROOT, invoke
from tests.helpers import free_port
from tests.test_metrics import scrape, value


def _job(job_id: str, queue: str | None = None) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    if queue is not None:
        data["queue"] = queue
    return Job.from_dict(data)


def _add_due(store: Store, *jobs: Job) -> dict[str, int]:
    """Store ``jobs``, due 10 s ago one ms apart in the order given; their due times."""
    store.upsert_many(list(jobs), stagger=False)
    now = store.now_ms()
    dues = {job.id: now - 10_000 + i for i, job in enumerate(jobs)}
    store.client.zadd(store.keys.schedule, dues, xx=True)
    return dues


def _counts(store: Store, keys: Keys | None = None) -> dict[str, int]:
    keys = keys or store.keys
    return {q: int(n) for q, n in store.client.hgetall(keys.queue_in_flight).items()}


def _tally(store: Store, keys: Keys | None = None) -> dict[str, int]:
    """What the counts must be: each occurrence in ``queued`` under its state's queue."""
    keys = keys or store.keys
    ids = store.client.zrange(keys.queued, 0, -1)
    found: Counter[str] = Counter()
    for raw in store.client.hmget(keys.state, ids) if ids else []:
        queue = json.loads(raw).get("bq") if raw else None
        if queue is not None:
            found[queue] += 1
    return dict(found)


def _held(store: Store) -> dict[str, int]:
    return {q: int(n) for q, n in store.client.hgetall(store.keys.queue_held).items()}


def _ids(claimed: list[Claimed]) -> list[str]:
    return [c.job.id for c in claimed]


# ---------------------------------------------------------------- the claim
def test_a_queue_at_its_bound_holds_back_only_its_own_jobs(
        make_store: Callable[..., Store]) -> None:
    store = make_store(queue_max_queued=2)
    dues = _add_due(store, *(_job(f"a{i}", "a") for i in range(4)),
                    _job("b0", "b"), _job("b1", "b"), _job("c0"))
    batch = store.claim()
    # a2 and a3 are due before b0, b1 and c0, and the claim takes those anyway.
    assert _ids(batch.jobs) == ["a0", "a1", "b0", "b1", "c0"]
    assert batch.queue_held == 2 and batch.held == 0
    assert _counts(store) == {"a": 2, "b": 2, "": 1} == _tally(store)
    assert _held(store) == {"a": 2}
    # Held back out of the due range, their due times kept.
    for job_id in ("a2", "a3"):
        assert store.client.zscore(store.keys.schedule, job_id) == PARK_BASE + dues[job_id]
        info = store.get(job_id)
        assert (info.status, info.due_ms) == ("scheduled", dues[job_id])
    # Nothing else is due: beat sleeps rather than spin on the held jobs.
    assert batch.next_due_ms is None
    assert store.stats()["held_back"] == 2 and store.stats()["total_queue_held"] == 2
    # A claim while the queue is still full neither takes nor holds them again.
    again = store.claim()
    assert (again.jobs, again.queue_held, again.next_due_ms) == ([], 0, None)
    assert _held(store) == {"a": 2}
    assert store.queue_backpressure() == {
        "": {"in_flight": 1, "held_back": 0}, "a": {"in_flight": 2, "held_back": 2},
        "b": {"in_flight": 2, "held_back": 0}}


def test_a_queue_is_the_jobs_queue_field_not_a_queue_key_in_its_meta(
        make_store: Callable[..., Store]) -> None:
    store = make_store()
    plain = Job.from_dict({"id": "m0", "url": "https://example.com/0", "interval_s": 60,
                           "meta": {"queue": "fake"}})
    routed = Job.from_dict({"id": "m1", "url": "https://example.com/1", "interval_s": 60,
                            "queue": "real", "meta": {"queue": "fake"}})
    _add_due(store, plain, routed)
    assert _ids(store.claim().jobs) == ["m0", "m1"]
    assert _counts(store) == {"": 1, "real": 1} == _tally(store)


def test_held_jobs_come_back_first_earliest_due_once_their_queue_has_room(
        make_store: Callable[..., Store]) -> None:
    store = make_store(queue_max_queued=2)
    dues = _add_due(store, *(_job(f"a{i}", "a") for i in range(4)))
    first = store.claim()
    assert _ids(first.jobs) == ["a0", "a1"] and first.queue_held == 2
    a0 = first.jobs[0]
    assert store.start("a0", a0.occurrence, a0.attempt).runs
    assert _counts(store) == {"a": 1} == _tally(store)
    # A later job of the same queue falls due: the held ones have waited longer.
    later = _add_due(store, _job("a9", "a"))
    store.client.zadd(store.keys.schedule, {"a9": later["a9"] + 5_000}, xx=True)
    back = store.claim()
    assert _ids(back.jobs) == ["a2"] and back.jobs[0].due_ms == dues["a2"]
    assert back.queue_held == 1  # a9 is held back in turn
    assert _held(store) == {"a": 2}
    assert _counts(store) == {"a": 2} == _tally(store)
    # Room again: held jobs go back in due order (a3, then a9); then none is held.
    a1 = first.jobs[1]
    store.start("a1", a1.occurrence, a1.attempt)
    store.start("a2", back.jobs[0].occurrence, back.jobs[0].attempt)
    assert _ids(store.claim().jobs) == ["a3", "a9"]
    assert _held(store) == {}
    assert store.client.zcount(store.keys.schedule, PARK_BASE, "+inf") == 0


def test_held_jobs_with_room_make_the_claim_report_them_due_now(
        make_store: Callable[..., Store]) -> None:
    """Room left after a claim, and held jobs that could take it: the claim says "due
    now", so beat comes back for them at once instead of sleeping to its next due job."""
    store = make_store(queue_max_queued=2)
    _add_due(store, *(_job(f"a{i}", "a") for i in range(4)))
    first = store.claim()
    assert _ids(first.jobs) == ["a0", "a1"] and first.next_due_ms is None
    for c in first.jobs:
        _start(store, c)
    batch = store.claim(limit=1)
    assert _ids(batch.jobs) == ["a2"]
    assert batch.next_due_ms == batch.now_ms  # a3 held, and a has room for it
    assert _ids(store.claim().jobs) == ["a3"]


def test_the_total_cap_still_bounds_all_queues_together(
        make_store: Callable[..., Store]) -> None:
    store = make_store(max_queued=3, queue_max_queued=2)
    _add_due(store, _job("a0", "a"), _job("a1", "a"), _job("b0", "b"), _job("b1", "b"))
    batch = store.claim()
    assert _ids(batch.jobs) == ["a0", "a1", "b0"] and batch.room == 0
    # b1 waits for the total cap, not for its queue: it stays in the due range.
    assert batch.queue_held == 0 and _held(store) == {}
    assert store.client.zscore(store.keys.schedule, "b1") < PARK_BASE
    assert batch.next_due_ms is not None and batch.next_due_ms <= batch.now_ms


def test_a_walk_over_every_held_job_corrects_the_held_counts(
        make_store: Callable[..., Store]) -> None:
    """A held job paused (or deleted, or run now) leaves the held range without the
    claim: the next claim that reads every held job counts what is really there."""
    store = make_store(queue_max_queued=1)
    _add_due(store, _job("a0", "a"), _job("a1", "a"), _job("a2", "a"))
    first = store.claim()
    assert _held(store) == {"a": 2}
    store.pause("a1")
    store.run_now("a2")  # due now again, out of the held range
    store.start("a0", first.jobs[0].occurrence, 1)
    batch = store.claim()
    assert _ids(batch.jobs) == ["a2"]
    assert _held(store) == {}


def test_the_gateway_claim_counts_no_queue(make_store: Callable[..., Store]) -> None:
    store = make_store(queue_max_queued=1)
    store.upsert_many([Job.from_dict({"id": f"h{i}", "url": f"https://example.com/{i}",
                                      "transport": "http", "queue": "a", "interval_s": 60})
                       for i in range(3)], stagger=False)
    store.client.zadd(store.keys.http_schedule, dict.fromkeys(("h0", "h1", "h2"), 1))
    assert len(store.claim_http(10).jobs) == 3
    assert _counts(store) == {} and _held(store) == {}


# ------------------------------------------------- every path out of queued
def _claimed(store: Store, queue: str = "x", *, routed: bool = True) -> Claimed:
    job = _job("j1", queue)
    _add_due(store, job, _job("other", "y"))
    batch = store.claim()
    (claimed,) = [c for c in batch.jobs if c.job.id == "j1"]
    if routed:
        assert store.routed([(claimed, queue)]) == 1
    assert _counts(store) == {queue: 1, "y": 1} == _tally(store)
    return claimed


def _deadline_passed(store: Store, job_id: str) -> None:
    store.client.zadd(store.keys.queued, {job_id: store.now_ms() - 1}, xx=True)


def _start(store: Store, c: Claimed) -> None:
    assert store.start(c.job.id, c.occurrence, c.attempt).runs


def _settle_unstarted(store: Store, c: Claimed) -> None:
    assert store.settle(c.job.id, c.occurrence, c.attempt, "skip", delivery=1).applied


def _reap_unpublished(store: Store, c: Claimed) -> None:
    _deadline_passed(store, c.job.id)
    assert store.reap().unpublished == 1


def _reap_lost(store: Store, c: Claimed) -> None:
    store.heartbeat([], worker="w1", queues=["x"])
    _deadline_passed(store, c.job.id)
    assert store.reap().lost == 1


def _reap_deleted(store: Store, c: Claimed) -> None:
    store.delete(c.job.id)
    _deadline_passed(store, c.job.id)
    store.reap()


def _reap_orphaned(store: Store, c: Claimed) -> None:
    # hold() answers the ids no longer held: none, so it is held.
    assert store.hold([(c.job.id, c.occurrence, c.attempt, 1, c.job.task)], "w1") == []
    store.client.zadd(store.keys.queued, {c.job.id: store.now_ms() - 1}, xx=True)
    assert store.reap().orphaned == 1


def _rescue(store: Store, c: Claimed) -> None:
    assert store.rescue([(c.job.id, c.occurrence, c.attempt, 1)]) == [c.job.id]


def _release(store: Store, c: Claimed) -> None:
    assert store.release([c]) == 1


def _start_deferred(store: Store, c: Claimed) -> None:
    """A retry round trip: start, Celery retry (queued again, counted), start again."""
    start = store.start(c.job.id, c.occurrence, c.attempt)
    assert start.runs
    assert store.retrying(c.job.id, c.occurrence, c.attempt, 10.0, fence=start.fence)
    assert _counts(store) == {"x": 1, "y": 1} == _tally(store)
    assert store.start(c.job.id, c.occurrence, c.attempt).runs


PATHS: dict[str, tuple[Callable[[Store, Claimed], None], bool]] = {
    "start": (_start, True),
    "settle_unstarted": (_settle_unstarted, True),
    "reap_unpublished": (_reap_unpublished, False),
    "reap_lost": (_reap_lost, True),
    "reap_deleted": (_reap_deleted, True),
    "reap_orphaned": (_reap_orphaned, True),
    "rescue_unacked": (_rescue, True),
    "release": (_release, False),
    "retry_then_start": (_start_deferred, True),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_out_of_queued_takes_it_out_of_its_queues_count(
        make_store: Callable[..., Store], path: str) -> None:
    store = make_store()
    leave, routed = PATHS[path]
    claimed = _claimed(store, routed=routed)
    leave(store, claimed)
    assert store.client.zscore(store.keys.queued, "j1") is None
    assert _counts(store) == {"y": 1} == _tally(store)


def test_a_message_only_waiting_keeps_its_count(make_store: Callable[..., Store]) -> None:
    """No worker consumes the queue: the passed delivery deadline restarts, and the
    occurrence still counts against its queue (it is still in the broker)."""
    store = make_store()
    claimed = _claimed(store)
    _deadline_passed(store, claimed.job.id)
    assert store.reap().held == 1
    assert _counts(store) == {"x": 1, "y": 1} == _tally(store)


def test_an_occurrence_queued_before_counts_existed_counts_nowhere(
        make_store: Callable[..., Store]) -> None:
    """Upgrade: a queued occurrence with no ``bq`` in its state (an older beat claimed
    it) leaves ``queued`` without taking anything from any count."""
    store = make_store()
    claimed = _claimed(store)
    raw = json.loads(store.client.hget(store.keys.state, "j1"))
    del raw["bq"]
    store.client.hset(store.keys.state, "j1", json.dumps(raw))
    store.client.hdel(store.keys.queue_in_flight, "x")
    _start(store, claimed)
    assert _counts(store) == {"y": 1} == _tally(store)


# ------------------------------------------------------------------ settings
def test_the_default_per_queue_bound_is_a_fifth_of_the_total_cap(
        make_settings: Callable[..., Any]) -> None:
    assert (make_settings().queued_bound, make_settings().queue_bound) == (10_000, 2_000)
    assert make_settings(max_queued=50).queue_bound == 10
    assert make_settings(max_queued=3).queue_bound == 1
    assert make_settings(max_queued=50, queue_max_queued=50).queue_bound == 50


@pytest.mark.parametrize(("values", "message"), [
    ({"queue_max_queued": -1}, "zsched_queue_max_queued must be >= 0"),
    ({"queue_max_queued": 10_001},
     "zsched_queue_max_queued (10001) must not exceed the total cap zsched_max_queued "
     "(10000: 10 x batch_size)"),
    ({"max_queued": 20, "queue_max_queued": 21},
     "zsched_queue_max_queued (21) must not exceed the total cap zsched_max_queued (20)"),
])
def test_a_per_queue_bound_out_of_range_is_refused_naming_the_setting(
        values: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_mapping({f"zsched_{k}": v for k, v in values.items()}, env={})
    assert message in str(caught.value)
    # The environment is checked the same way.
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_mapping({}, env={f"ZSCHED_{k.upper()}": str(v) for k, v in values.items()})
    assert message in str(caught.value)


# ------------------------------------------------------- what operators see
def test_the_exporter_and_stats_show_each_queues_in_flight_and_held_back(
        make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(queue_max_queued=1)
    _add_due(store, _job("a0", "a"), _job("a1", "a"), _job("a2", "a"), _job("b0", "b"))
    assert _ids(store.claim().jobs) == ["a0", "b0"]
    port = free_port()
    server, _thread = serve(store, port)
    try:
        samples = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert value(samples, "zsched_queue_in_flight", queue="a") == 1
    assert value(samples, "zsched_queue_in_flight", queue="b") == 1
    assert value(samples, "zsched_queue_held_back", queue="a") == 2
    assert value(samples, "zsched_queue_held_back", queue="b") == 0
    assert value(samples, "zsched_queue_holds_total") == 2
    assert (value(samples, "zsched_queue_bound"), value(samples, "zsched_queued_cap")) == (
        1, 10_000)
    for name, setting in (("REDIS_URL", store.settings.redis_url),
                          ("KEY_PREFIX", store.settings.key_prefix), ("QUEUE_MAX_QUEUED", "1")):
        monkeypatch.setenv(f"ZSCHED_{name}", setting)
    monkeypatch.syspath_prepend(str(ROOT))
    lines = invoke("stats").stdout.splitlines()
    assert "queue a: 1/1 in flight, 2 held back" in lines
    assert "queue b: 1/1 in flight, 0 held back" in lines
    as_json = json.loads(invoke("stats", "--json").stdout)
    assert as_json["queues"]["a"] == {"in_flight": 1, "held_back": 2}
    assert as_json["held_back"] == 2


# ------------------------------------------------------------- repartition
def test_repartition_recounts_every_partition_and_releases_held_jobs(
        make_store: Callable[..., Store]) -> None:
    store = make_store(queue_max_queued=2)
    dues = _add_due(store, *(_job(f"a{i}", "a") for i in range(5)), _job("b0", "b"))
    assert _ids(store.claim().jobs) == ["a0", "a1", "b0"]
    repartition(store.client, store.settings, 3)
    moved = Store(store.client, dataclasses.replace(store.settings, partitions=3))
    total: Counter[str] = Counter()
    for keys in moved.parts:
        assert _counts(store, keys) == _tally(store, keys)
        total.update(_counts(store, keys))
        assert store.client.zcount(keys.schedule, PARK_BASE, "+inf") == 0
        assert store.client.exists(keys.queue_held) == 0
    assert total == {"a": 2, "b": 1}
    # The held jobs are plainly due again, at their own due times.
    assert [moved.get(f"a{i}").due_ms for i in range(2, 5)] == [dues[f"a{i}"]
                                                                for i in range(2, 5)]
