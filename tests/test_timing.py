"""Due-time rules: jitter, cron across DST, one-offs, catch-up, misfire, backoff, end."""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.core.timing import backoff_s, cron_next, dt_to_ms
from celery_zsched.store import SettleResult, Store

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _fires(expr: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """Walk successive cron_next calls from ``start`` (exclusive) to ``end`` (exclusive)."""
    out: list[datetime] = []
    t = start
    while True:
        t = cron_next(expr, tz, t)
        if t >= end:
            return out
        out.append(t)


def _job(job_id: str = "t1", **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _delay_ms(res: SettleResult) -> int:
    """How far after the settle (on the Redis clock) the next run was put."""
    assert res.next_due_ms is not None and res.now_ms is not None
    return res.next_due_ms - res.now_ms


def _make_due(store: Store, job_id: str, due_ms: int | None = None) -> None:
    due = store.now_ms() - 1 if due_ms is None else due_ms
    store.client.zadd(store.keys.schedule, {job_id: due}, xx=True)
    assert store.client.zscore(store.keys.schedule, job_id) == due


# -------------------------------------------------------------------- jitter
def test_interval_jitter_stays_within_interval_and_interval_plus_jitter() -> None:
    """next_regular_ms = now + interval + U[0, jitter]: never early, never past the jitter."""
    settings = Settings()
    rng = random.Random()
    job = _job(interval_s=300, jitter_s=30)
    now = 1_800_000_000_000
    draws = [job.next_regular_ms(now, settings, rng) for _ in range(2000)]
    offsets = [d - now for d in draws if d is not None]
    assert len(offsets) == 2000
    assert all(300_000 <= o <= 330_000 for o in offsets)
    assert len(set(offsets)) > 1000, "jitter must actually vary"
    assert min(offsets) < 303_000 and max(offsets) > 327_000


def test_jitter_defaults_to_the_max_jitter_setting() -> None:
    """A job without its own jitter_s uses zsched_max_jitter_s; jitter_s=0 disables it."""
    rng = random.Random(7)
    settings = Settings(max_jitter_s=10)
    inherits = Job.from_dict({"id": "a", "task": "t", "interval_s": 60})
    offsets = {(inherits.next_regular_ms(0, settings, rng) or 0) - 60_000 for _ in range(500)}
    assert min(offsets) >= 0 and max(offsets) <= 10_000 and len(offsets) > 100
    assert {_job(jitter_s=0).next_regular_ms(0, settings, rng) for _ in range(50)} == {60_000}


def test_settle_complete_with_jitter_lands_within_the_jitter_window(
    make_store: Callable[..., Store],
) -> None:
    """Through Redis: each complete reschedules at now + interval + [0, jitter]."""
    store = make_store()
    job = _job("jit", interval_s=5, jitter_s=2)
    store.upsert(job)
    delays = []
    for _ in range(20):
        _make_due(store, job.id)
        claimed = store.claim().jobs[0]
        res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
        delays.append(_delay_ms(res))
    assert all(5_000 - 50 <= d <= 7_000 for d in delays)
    assert len(set(delays)) > 10


# ---------------------------------------------------------------------- cron
def test_cron_berlin_spring_forward_fires_skipped_time_once_shifted_by_the_gap() -> None:
    """2026-03-29 Berlin, 02:00->03:00: "30 2 * * *" fires once, at 03:30 CEST (01:30 UTC)."""
    day_start, day_end = _utc("2026-03-28T23:00"), _utc("2026-03-29T22:00")  # local midnights
    assert _fires("30 2 * * *", BERLIN, day_start, day_end) == [_utc("2026-03-29T01:30")]
    assert cron_next("30 2 * * *", BERLIN, _utc("2026-03-29T01:30")) == _utc("2026-03-30T00:30")
    assert cron_next("30 2 * * *", BERLIN, _utc("2026-03-28T12:00")) == _utc("2026-03-29T01:30")
    # The day before, a normal day: 02:30 CET is 01:30 UTC.
    assert _fires("30 2 * * *", BERLIN, _utc("2026-03-27T23:00"), day_start) == [
        _utc("2026-03-28T01:30")]


def test_cron_berlin_fall_back_fires_repeated_time_exactly_once() -> None:
    """2026-10-25 Berlin, 03:00->02:00: "30 2 * * *" fires once, at the first 02:30 (CEST)."""
    day_start, day_end = _utc("2026-10-24T22:00"), _utc("2026-10-25T23:00")  # 25-hour day
    assert _fires("30 2 * * *", BERLIN, day_start, day_end) == [_utc("2026-10-25T00:30")]
    # From inside the repeated hour, the next fire is the next day's 02:30 CET.
    assert cron_next("30 2 * * *", BERLIN, _utc("2026-10-25T00:45")) == _utc("2026-10-26T01:30")


def test_cron_new_york_spring_forward_fires_skipped_time_once_shifted_by_the_gap() -> None:
    """2026-03-08 New York, 02:00->03:00: "30 2 * * *" fires once, at 03:30 EDT (07:30 UTC)."""
    day_start, day_end = _utc("2026-03-08T05:00"), _utc("2026-03-09T04:00")
    assert _fires("30 2 * * *", NEW_YORK, day_start, day_end) == [_utc("2026-03-08T07:30")]
    assert cron_next("30 2 * * *", NEW_YORK, _utc("2026-03-08T07:30")) == _utc(
        "2026-03-09T06:30")


def test_cron_new_york_fall_back_fires_repeated_time_exactly_once() -> None:
    """2026-11-01 New York, 02:00->01:00: "30 1 * * *" fires once, at 01:30 EDT (05:30 UTC)."""
    day_start, day_end = _utc("2026-11-01T04:00"), _utc("2026-11-02T05:00")
    assert _fires("30 1 * * *", NEW_YORK, day_start, day_end) == [_utc("2026-11-01T05:30")]
    assert cron_next("30 1 * * *", NEW_YORK, _utc("2026-11-01T05:30")) == _utc(
        "2026-11-02T06:30")


@pytest.mark.parametrize(
    ("tz", "day_start", "day_end", "fires", "repeated"),
    [
        (NEW_YORK, "2026-11-01T04:00", "2026-11-02T05:00", 50,
         ["2026-11-01T05:30", "2026-11-01T06:30"]),
        (BERLIN, "2026-10-24T22:00", "2026-10-25T23:00", 50,
         ["2026-10-25T00:30", "2026-10-25T01:30"]),
        (NEW_YORK, "2026-03-08T05:00", "2026-03-09T04:00", 46, []),
        (BERLIN, "2026-03-28T23:00", "2026-03-29T22:00", 46, []),
    ],
    ids=["new-york-fall", "berlin-fall", "new-york-spring", "berlin-spring"],
)
def test_wildcard_hour_cron_keeps_firing_every_30_real_minutes_across_dst(
    tz: ZoneInfo, day_start: str, day_end: str, fires: int, repeated: list[str],
) -> None:
    """"*/30 * * * *" fires every 30 real minutes, through the repeated or skipped hour."""
    times = _fires("*/30 * * * *", tz, _utc(day_start) - timedelta(seconds=1), _utc(day_end))
    assert len(times) == fires
    assert times[0] == _utc(day_start)
    assert {b - a for a, b in itertools.pairwise(times)} == {timedelta(minutes=30)}
    for instant in repeated:  # the same wall time, 01:30 or 02:30, fires in both offsets
        assert _utc(instant) in times


def test_cron_job_first_and_next_due_follow_its_zone() -> None:
    """Job.first_due_ms/next_regular_ms give UTC epoch ms of the zone's wall-clock slots."""
    settings = Settings()
    rng = random.Random(1)
    job = Job.from_dict({"id": "c", "task": "t", "cron": "30 2 * * *",
                         "timezone": "Europe/Berlin"})
    now = dt_to_ms(_utc("2026-03-29T00:00"))
    first = job.first_due_ms(now, settings, rng)
    assert first == dt_to_ms(_utc("2026-03-29T01:30"))
    assert job.next_regular_ms(first, settings, rng) == dt_to_ms(_utc("2026-03-30T00:30"))
    # A slot exactly at "now" is the first due, not skipped.
    assert job.first_due_ms(first, settings, rng) == first
    ny = Job.from_dict({"id": "n", "task": "t", "cron": "30 1 * * *",
                        "timezone": "America/New_York"})
    fall = dt_to_ms(_utc("2026-11-01T05:30"))
    assert ny.next_regular_ms(fall, settings, rng) == dt_to_ms(_utc("2026-11-02T06:30"))


# ------------------------------------------------------------------ one-off
def test_one_off_job_fires_once(store: Store) -> None:
    """A run_at job is claimed once; after its settle it is finished and never claimed again."""
    run_at_s = store.now_ms() / 1000 - 5
    job = Job.from_dict({"id": "once", "task": "tests.noop", "run_at": run_at_s})
    assert job.kind == "once"
    store.upsert(job)
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == ["once"]
    claimed = batch.jobs[0]
    assert claimed.due_ms == job.run_at
    res = store.settle("once", claimed.occurrence, claimed.attempt, "complete")
    assert (res.applied, res.status, res.next_due_ms) == (True, "finished", None)
    assert store.client.zscore(store.keys.schedule, "once") is None
    assert store.client.zscore(store.keys.leases, "once") is None
    assert store.get("once").status == "finished"
    assert store.claim().jobs == []
    # Importing it again does not fire it again.
    assert store.upsert(job).rescheduled == 0
    assert store.claim().jobs == []


def test_one_off_job_in_the_future_waits_for_its_time(store: Store) -> None:
    """A run_at in the future is scheduled at exactly that instant."""
    run_at_ms = store.now_ms() + 3_600_000
    job = Job.from_dict({"id": "later", "task": "t", "run_at": run_at_ms / 1000})
    store.upsert(job)
    assert store.client.zscore(store.keys.schedule, "later") == job.run_at
    assert job.run_at is not None and abs(job.run_at - run_at_ms) <= 1
    assert store.claim().jobs == []


# ------------------------------------------------------------------ catch-up
def test_after_downtime_an_overdue_job_fires_once_then_resumes_from_now(store: Store) -> None:
    """Ten days of missed 60 s slots produce one fire, then now + 60 s (invariant 4)."""
    job = _job("catchup", interval_s=60)
    store.upsert(job)
    long_ago = store.now_ms() - 10 * 86_400_000
    _make_due(store, job.id, long_ago)
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == [job.id]
    assert batch.jobs[0].due_ms == long_ago
    assert store.claim().jobs == []
    claimed = batch.jobs[0]
    res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied
    assert 60_000 - 50 <= _delay_ms(res) <= 60_000
    assert store.client.zscore(store.keys.schedule, job.id) == res.next_due_ms
    assert store.client.zcard(store.keys.schedule) == 1
    assert store.claim().jobs == []


# ------------------------------------------------------------------- misfire
@pytest.fixture
def beat(make_settings: Callable[..., Settings], redis_url: str,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[ZSchedScheduler]:
    """An in-process beat scheduler on the throwaway Redis (also its broker)."""
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)
    settings = make_settings()
    app = Celery("timing-tests", set_as_current=False)
    app.conf["broker_url"] = redis_url
    app.conf.zsched_redis_url = settings.redis_url
    app.conf.zsched_key_prefix = settings.key_prefix
    scheduler = ZSchedScheduler(app=app)
    yield scheduler
    scheduler.close()


def _published_job_ids(client: redis.Redis, queue: str = "celery") -> list[str]:
    return [json.loads(raw)["headers"]["zsched_job_id"] for raw in client.lrange(queue, 0, -1)]


def test_misfire_grace_skips_a_fire_that_is_too_late(beat: ZSchedScheduler,
                                                     rclient: redis.Redis) -> None:
    """A fire later than misfire_grace_s is skipped and rescheduled; one without grace runs."""
    store = beat.store
    store.upsert(_job("graceful", misfire_grace_s=1))
    store.upsert(_job("no-grace"))
    hour_ago = store.now_ms() - 3_600_000
    _make_due(store, "graceful", hour_ago)
    _make_due(store, "no-grace", hour_ago)
    beat.tick()
    assert _published_job_ids(rclient) == ["no-grace"]
    skipped = store.get("graceful")
    assert skipped.status == "scheduled"
    assert skipped.state.last_outcome == "skipped"
    assert skipped.lease_until_ms is None
    assert skipped.due_ms is not None and 59_000 <= skipped.due_ms - store.now_ms() <= 60_000
    assert store.get("no-grace").status == "queued"
    assert rclient.hget(store.keys.counters, "skipped") == "1"
    events = [e for _, e in store.events()]
    assert [(e["id"], e["status"]) for e in events] == [("graceful", "skipped")]


def test_misfire_grace_lets_a_fire_within_grace_run(beat: ZSchedScheduler,
                                                    rclient: redis.Redis) -> None:
    """A fire only slightly late (within the grace) is published."""
    store = beat.store
    store.upsert(_job("ontime", misfire_grace_s=600))
    _make_due(store, "ontime", store.now_ms() - 5_000)
    beat.tick()
    assert _published_job_ids(rclient) == ["ontime"]
    assert store.get("ontime").state.last_outcome is None


# ------------------------------------------------------------------- backoff
def test_backoff_doubles_then_caps_then_falls_back_to_the_regular_run(
    make_store: Callable[..., Store],
) -> None:
    """Errors retry at base * 2**(n-1) capped; after retry_max the next regular run follows."""
    store = make_store(retry_base_s=10, retry_cap_s=25, retry_max=3)
    job = _job("flaky", interval_s=600)
    store.upsert(job)
    first = store.claim().jobs[0]
    occurrence, task_ids = first.occurrence, {first.task_id}
    for attempt, expected_s in ((1, 10), (2, 20), (3, 25)):
        claimed = first if attempt == 1 else store.claim().jobs[0]
        assert (claimed.occurrence, claimed.attempt) == (occurrence, attempt)
        task_ids.add(claimed.task_id)
        res = store.settle(job.id, occurrence, attempt, "error", error=f"boom {attempt}")
        assert (res.applied, res.label, res.status) == (True, "retrying", "scheduled")
        assert expected_s * 1000 - 50 <= _delay_ms(res) <= expected_s * 1000
        state = store.get(job.id).state
        assert (state.attempt, state.consecutive_failures, state.failures, state.last_error) == (
            attempt + 1, attempt, attempt, f"boom {attempt}")
        _make_due(store, job.id)
    assert len(task_ids) == 3, "each attempt has its own task id"
    last = store.claim().jobs[0]
    assert last.attempt == 4
    res = store.settle(job.id, occurrence, 4, "error", error="still down")
    assert (res.label, res.status) == ("error", "scheduled")
    assert 600_000 - 50 <= _delay_ms(res) <= 600_000
    state = store.get(job.id).state
    assert (state.occurrence, state.attempt, state.consecutive_failures, state.runs) == (
        res.next_due_ms, 1, 4, 1)
    # A success resets the failure streak.
    _make_due(store, job.id)
    ok = store.claim().jobs[0]
    assert store.settle(job.id, ok.occurrence, ok.attempt, "complete").applied
    assert store.get(job.id).state.consecutive_failures == 0


def test_explicit_retry_after_overrides_the_backoff(make_store: Callable[..., Store]) -> None:
    """retry_after_s (e.g. from Retry-After) sets the retry delay exactly."""
    store = make_store(retry_base_s=10)
    store.upsert(_job("rl"))
    claimed = store.claim().jobs[0]
    res = store.settle("rl", claimed.occurrence, claimed.attempt, "error", retry_after_s=123)
    assert res.label == "retrying"
    assert 123_000 - 50 <= _delay_ms(res) <= 123_000


def test_backoff_formula_and_per_job_retry_settings() -> None:
    """backoff_s is base * 2**(n-1) capped; a job's retry_max/retry_base_s override settings."""
    assert [backoff_s(n, 10, 25) for n in (1, 2, 3, 4, 10)] == [10, 20, 25, 25, 25]
    settings = Settings(retry_max=3, retry_base_s=30, retry_cap_s=3600)
    default = _job()
    assert default.retry_due_ms(1, 0, settings) == 30_000
    assert default.retry_due_ms(3, 0, settings) == 120_000
    assert default.retry_due_ms(4, 0, settings) is None
    own = _job(retry_max=1, retry_base_s=2)
    assert own.retry_due_ms(1, 0, settings) == 2_000
    assert own.retry_due_ms(2, 0, settings) is None
    assert _job(retry_max=0).retry_due_ms(1, 0, settings) is None


# ---------------------------------------------------------------------- end
def test_max_runs_ends_a_job(store: Store) -> None:
    """After max_runs completed runs the job is finished and no longer scheduled."""
    store.upsert(_job("twice", max_runs=2))
    first = store.claim().jobs[0]
    assert store.settle("twice", first.occurrence, first.attempt, "complete").status == "scheduled"
    _make_due(store, "twice")
    second = store.claim().jobs[0]
    res = store.settle("twice", second.occurrence, second.attempt, "complete")
    assert (res.applied, res.status) == (True, "finished")
    assert store.client.zscore(store.keys.schedule, "twice") is None
    assert store.get("twice").state.runs == 2
    assert store.claim().jobs == []


def test_end_at_ends_a_job(store: Store) -> None:
    """A next run past end_at finishes the job; an end_at already past stores it finished."""
    end_s = store.now_ms() / 1000 + 30
    store.upsert(_job("ending", interval_s=60, end_at=end_s))
    claimed = store.claim().jobs[0]
    res = store.settle("ending", claimed.occurrence, claimed.attempt, "complete")
    assert (res.status, res.next_due_ms) == ("finished", None)
    assert store.client.zscore(store.keys.schedule, "ending") is None
    assert store.claim().jobs == []

    report = store.upsert(_job("ended", end_at=store.now_ms() / 1000 - 60))
    assert report.created == 1
    assert store.get("ended").status == "finished"
    assert store.client.zscore(store.keys.schedule, "ended") is None


def test_end_at_and_start_at_bound_the_computed_due_times() -> None:
    """next_regular_ms is None past end_at; first_due_ms waits for start_at."""
    settings, rng = Settings(), random.Random(3)
    now = 1_800_000_000_000
    ending = _job(end_at=(now + 30_000) / 1000)
    assert ending.next_regular_ms(now, settings, rng) is None
    assert ending.next_regular_ms(now - 40_000, settings, rng) == now + 20_000
    cron = Job.from_dict({"id": "c", "task": "t", "cron": "0 0 * * *",
                          "end_at": (now + 60_000) / 1000})
    assert cron.next_regular_ms(now, settings, rng) is None
    starting = _job(start_at=(now + 3_600_000) / 1000)
    assert starting.first_due_ms(now, settings, rng) == now + 3_600_000
