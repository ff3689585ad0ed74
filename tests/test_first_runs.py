"""First runs: start_at keeps the import stagger and the jitter; intervals round to the ms."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import Store, settles

N = 100
INTERVAL_S = 300
JITTER_S = 30


def _jobs(start_at_ms: int | None, jitter_s: float) -> list[Job]:
    extra = {} if start_at_ms is None else {"start_at": start_at_ms / 1000}
    return [Job.from_dict({"url": f"https://example.com/start/{i}", "interval_s": INTERVAL_S,
                           "jitter_s": jitter_s, **extra})
            for i in range(N)]


def _dues(store: Store, jobs: list[Job]) -> list[int]:
    pipe = store.client.pipeline(transaction=False)
    for job in jobs:
        pipe.zscore(store.keys.schedule, job.id)
    scores = pipe.execute()
    assert None not in scores
    return [int(s) for s in scores]


def test_import_with_a_future_start_at_spreads_first_runs_from_start_at(
    make_store: Callable[..., Store],
) -> None:
    """100 jobs, 300 s, 30 s jitter, start_at in an hour: spread over [start_at, +330 s)."""
    store = make_store()
    start_at = (store.now_ms() + 3_600_000) // 1000 * 1000  # whole seconds: exact in ISO
    jobs = _jobs(start_at, JITTER_S)
    store.upsert_many(jobs, stagger=True)
    dues = _dues(store, jobs)
    for i, due in enumerate(dues):
        slot = start_at + i * INTERVAL_S * 1000 // N
        assert slot <= due <= slot + JITTER_S * 1000, (i, due - start_at)
    # No herd (the bug put all 100 in one millisecond). Independent jitter draws over
    # overlapping 30 s windows share a millisecond about once in fifty runs, so allow a
    # few coincidences; no second may hold more than five.
    assert len(set(dues)) >= N - 3
    assert max(Counter(d // 1000 for d in dues).values()) <= 5
    assert max(dues) - min(dues) >= (INTERVAL_S - JITTER_S) * 1000
    # The jitter really is drawn (not all zero offsets from the slots).
    offsets = [due - (start_at + i * INTERVAL_S * 1000 // N) for i, due in enumerate(dues)]
    assert len(set(offsets)) > N // 2 and max(offsets) > JITTER_S * 1000 // 2


def test_import_with_a_future_start_at_and_no_jitter_lands_on_the_exact_slots(
    make_store: Callable[..., Store],
) -> None:
    """Without jitter job i first runs at exactly start_at + i/N * interval."""
    store = make_store()
    start_at = (store.now_ms() + 86_400_000) // 1000 * 1000
    jobs = _jobs(start_at, 0)
    store.upsert_many(jobs, stagger=True)
    assert _dues(store, jobs) == [start_at + i * 3_000 for i in range(N)]
    assert {b - a for a, b in itertools.pairwise(_dues(store, jobs))} == {3_000}


def test_a_past_start_at_staggers_from_now_as_without_one(make_store: Callable[..., Store]) -> None:
    """start_at already passed: the first runs spread from now, like jobs with no start_at."""
    store = make_store()
    before = store.now_ms()
    jobs = _jobs(before - 3_600_000, 0)
    store.upsert_many(jobs, stagger=True)
    after = store.now_ms()
    for i, due in enumerate(_dues(store, jobs)):
        assert before + i * 3_000 <= due <= after + i * 3_000


def test_first_due_of_one_job_with_start_at_adds_phase_and_jitter() -> None:
    """Job.first_due_ms: max(now, start_at) + phase * interval + U(0, jitter)."""
    settings = Settings()
    now, start_at = 1_800_000_000_000, 1_800_000_600_000
    job = Job.from_dict({"id": "s", "task": "t", "interval_s": 100, "jitter_s": 10,
                         "start_at": start_at / 1000})
    draws = [job.first_due_ms(now, settings, random.Random(seed), 0.25) for seed in range(200)]
    offsets = [d - (start_at + 25_000) for d in draws if d is not None]
    assert len(offsets) == 200
    assert all(0 <= o <= 10_000 for o in offsets)
    assert len(set(offsets)) > 150


# ------------------------------------------------------- interval rounding
def test_decimal_interval_is_rounded_not_truncated_to_the_millisecond() -> None:
    """2.01 s is 2010 ms (2.01 * 1000 is 2009.999... in floating point)."""
    settings, rng = Settings(), random.Random(1)
    for seconds, ms in ((2.01, 2010), (0.29, 290), (4.35, 4350), (1.1, 1100), (0.0015, 2)):
        job = Job.from_dict({"id": "r", "task": "t", "interval_s": seconds, "jitter_s": 0})
        assert job.next_regular_ms(1_000_000, settings, rng) == 1_000_000 + ms, seconds
    staggered = Job.from_dict({"id": "p", "task": "t", "interval_s": 2.01, "jitter_s": 0})
    assert staggered.first_due_ms(0, settings, rng, phase=0.5) == 1005


def test_a_settle_through_redis_reschedules_2_01_s_after_as_2010_ms(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the store: a completed 2.01 s job is due 2010 ms after the settle's clock
    (the settle script's: "now plus a delay" is counted from the moment it applies)."""
    clock: list[int] = []
    read_time = settles.time_ms

    def recording(reply: Any) -> int:  # the Redis TIME the settle computes from
        clock.append(read_time(reply))
        return clock[-1]

    job = Job.from_dict({"id": "decimal", "task": "t", "interval_s": 2.01, "jitter_s": 0})
    store.upsert(job)
    claimed = store.claim().jobs[0]
    monkeypatch.setattr(settles, "time_ms", recording)
    res = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
    assert res.applied and res.next_due_ms is not None and res.now_ms is not None and clock
    assert res.next_due_ms - res.now_ms == 2010
    assert clock[-1] <= res.now_ms
    assert store.client.zscore(store.keys.schedule, job.id) == res.next_due_ms
