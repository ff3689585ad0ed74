"""The next N fire times (celery_zsched.services.preview): DST gaps and folds, the job's
limits, pause, and stored jobs read from real Redis."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from datetime import datetime

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.core.timing import UTC, dt_to_ms
from celery_zsched.services.preview import Fire, next_fires, preview, preview_info
from celery_zsched.store import Store

SETTINGS = Settings(max_jitter_s=0)
BERLIN = "Europe/Berlin"


def ms(text: str) -> int:
    return dt_to_ms(datetime.fromisoformat(text).replace(tzinfo=UTC))


def cron(expr: str, **fields: object) -> Job:
    return Job.from_dict({"id": "j", "task": "t", "cron": expr, "timezone": BERLIN, **fields})


def utc(fires: list[Fire]) -> list[str]:
    return [f.utc.strftime("%Y-%m-%dT%H:%M") for f in fires]


def test_a_cron_slot_in_the_spring_gap_is_shifted_forward() -> None:
    fires = next_fires(cron("30 2 * * *"), ms("2026-03-28T12:00"), 3, SETTINGS)
    assert utc(fires) == ["2026-03-29T01:30", "2026-03-30T00:30", "2026-03-31T00:30"]
    assert fires[0].local.strftime("%H:%M %z") == "03:30 +0200"
    assert [f.shifted for f in fires] == [True, False, False]
    assert not any(f.repeated for f in fires)


def test_an_hourly_cron_fires_twice_in_the_autumn_fold_and_says_so() -> None:
    fires = next_fires(cron("0 * * * *"), ms("2026-10-24T23:30"), 4, SETTINGS)
    assert utc(fires) == ["2026-10-25T00:00", "2026-10-25T01:00", "2026-10-25T02:00",
                          "2026-10-25T03:00"]
    assert [f.local.strftime("%H:%M %z") for f in fires] == [
        "02:00 +0200", "02:00 +0100", "03:00 +0100", "04:00 +0100"]
    assert [f.repeated for f in fires] == [True, True, False, False]
    assert not any(f.shifted for f in fires)


def test_a_daily_cron_in_the_fold_fires_once_in_its_first_pass() -> None:
    fires = next_fires(cron("30 2 * * *"), ms("2026-10-24T12:00"), 2, SETTINGS)
    assert utc(fires) == ["2026-10-25T00:30", "2026-10-26T01:30"]
    assert not any(f.repeated or f.shifted for f in fires)


def test_cron_fires_are_the_slots_the_scheduler_computes() -> None:
    job = cron("*/20 1-3 * * *")
    after = ms("2026-03-28T20:00")
    fires = next_fires(job, after, 30, SETTINGS)
    expected, t = [], after
    for _ in range(30):
        nxt = job.next_regular_ms(t, SETTINGS, random.Random(0))
        assert nxt is not None
        expected.append(nxt)
        t = nxt
    assert [f.utc_ms for f in fires] == expected


def test_jitter_is_a_bound_after_each_fire() -> None:
    fires = next_fires(cron("0 12 * * *", jitter_s=90), ms("2026-05-01T00:00"), 2, SETTINGS)
    assert [f.latest_ms - f.utc_ms for f in fires] == [90_000, 90_000]
    assert fires[0].to_dict()["latest_utc"] == "2026-05-01T10:01:30Z"


def test_max_runs_counts_from_the_runs_already_done() -> None:
    job = cron("0 12 * * *", max_runs=5)
    result = preview(job, ms("2026-05-01T00:00"), 10, SETTINGS, RuntimeState(runs=3))
    assert len(result.fires) == 2 and "max_runs (5)" in result.note
    done = preview(job, ms("2026-05-01T00:00"), 10, SETTINGS, RuntimeState(runs=5))
    assert done.fires == [] and done.status == "finished"


def test_end_at_cuts_the_list_and_start_at_opens_it() -> None:
    job = cron("0 12 * * *", start_at="2026-05-03T00:00:00Z", end_at="2026-05-05T12:00:00Z")
    result = preview(job, ms("2026-05-01T00:00"), 10, SETTINGS)
    assert utc(result.fires) == ["2026-05-03T10:00", "2026-05-04T10:00", "2026-05-05T10:00"]
    assert "end_at 2026-05-05T12:00:00Z" in result.note


def test_a_jitter_window_stops_at_end_at() -> None:
    job = Job.from_dict({"id": "j", "task": "t", "interval_s": 60, "jitter_s": 30,
                         "end_at": "2026-05-01T00:01:10Z"})
    fires = next_fires(job, ms("2026-05-01T00:00"), 10, SETTINGS)
    assert [f.jitter_ms for f in fires] == [30_000, 10_000]


def test_a_paused_job_has_no_fires_and_says_paused() -> None:
    result = preview(cron("0 12 * * *", enabled=False), ms("2026-05-01T00:00"), 10, SETTINGS)
    assert result.fires == [] and result.status == "paused" and "paused" in result.note


def test_a_one_off_fires_once_then_never() -> None:
    job = Job.from_dict({"id": "j", "task": "t", "run_at": "2026-05-02T08:00:00Z"})
    result = preview(job, ms("2026-05-01T00:00"), 10, SETTINGS)
    assert utc(result.fires) == ["2026-05-02T08:00"] and "one-off" in result.note
    assert next_fires(job, ms("2026-05-01T00:00"), 10, SETTINGS, RuntimeState(runs=1)) == []


# ------------------------------------------------------------ stored jobs
def test_a_stored_interval_job_fires_at_its_due_time_then_every_interval(
        make_store: Callable[..., Store]) -> None:
    store = make_store(max_jitter_s=0)
    job = Job.from_dict({"id": "iv", "task": "t", "interval_s": 600, "jitter_s": 5})
    store.upsert_many([job], stagger=False)
    info = store.get("iv")
    assert info.due_ms is not None
    result = preview_info(info, store.now_ms(), 3, store.settings)
    assert [f.utc_ms for f in result.fires] == [info.due_ms + k * 600_000 for k in range(3)]
    # The stored due time holds its drawn jitter already; the later ones may add some.
    assert [f.jitter_ms for f in result.fires] == [0, 5000, 5000]


def test_a_stored_cron_job_starts_at_its_due_time(make_store: Callable[..., Store]) -> None:
    store = make_store(max_jitter_s=0)
    store.upsert(cron("*/5 * * * *", id="cr"))
    info = store.get("cr")
    fires = preview_info(info, store.now_ms(), 3, store.settings).fires
    assert fires[0].utc_ms == info.due_ms
    assert [b.utc_ms - a.utc_ms for a, b in itertools.pairwise(fires)] == [
        300_000, 300_000]


def test_a_job_paused_in_redis_has_no_fires(make_store: Callable[..., Store]) -> None:
    store = make_store(max_jitter_s=0)
    store.upsert(cron("0 12 * * *", id="p"))
    store.pause("p")
    result = preview_info(store.get("p"), store.now_ms(), 10, store.settings)
    assert result.fires == [] and result.status == "paused"
