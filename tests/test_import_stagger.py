"""Bulk imports spread first runs over the interval and are idempotent (invariant 7)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable

from celery_zsched.core.job import Job
from celery_zsched.store import Store

N = 10_000
INTERVAL_S = 300


def _jobs(jitter_s: float) -> list[Job]:
    return [
        Job.from_dict({"url": f"https://example.com/page/{i}", "interval_s": INTERVAL_S,
                       "jitter_s": jitter_s})
        for i in range(N)
    ]


def _scores(store: Store, jobs: list[Job]) -> list[float | None]:
    pipe = store.client.pipeline(transaction=False)
    for job in jobs:
        pipe.zscore(store.keys.schedule, job.id)
    return list(pipe.execute())


def test_import_spreads_first_runs_evenly_over_the_interval(
    make_store: Callable[..., Store],
) -> None:
    """10,000 jobs on 300 s: no gap between first runs exceeds twice the even spacing."""
    store = make_store()
    jobs = _jobs(jitter_s=0)
    assert len({j.id for j in jobs}) == N
    before = store.now_ms()
    report = store.upsert_many(jobs, stagger=True)
    assert (report.total, report.created, report.updated) == (N, N, 0)
    scores = _scores(store, jobs)
    assert None not in scores
    dues = sorted(int(s) for s in scores if s is not None)
    spacing_ms = INTERVAL_S * 1000 / N  # 30 ms
    gaps = [b - a for a, b in itertools.pairwise(dues)]
    assert max(gaps) <= 2 * spacing_ms
    # They span (almost) the whole interval, starting now.
    assert 0 <= dues[0] - before < 1000
    assert dues[-1] - dues[0] >= INTERVAL_S * 1000 - 2 * spacing_ms
    assert dues[-1] - dues[0] < INTERVAL_S * 1000
    # No thundering herd: no second holds more than twice the even rate.
    per_second = Counter((d - dues[0]) // 1000 for d in dues)
    assert max(per_second.values()) <= 2 * N / INTERVAL_S
    assert len(per_second) == INTERVAL_S


def test_reimport_moves_no_schedule_and_counts_updates(make_store: Callable[..., Store]) -> None:
    """Importing the same 10,000 jobs again keeps every due time: created=0, updated=10000."""
    store = make_store()
    jobs = _jobs(jitter_s=0)
    store.upsert_many(jobs, stagger=True)
    first = _scores(store, jobs)
    again = store.upsert_many(jobs, stagger=True)
    assert (again.total, again.created, again.updated, again.rescheduled) == (N, 0, N, 0)
    assert _scores(store, jobs) == first
    # Also when the rows come in another order (a re-export, a shuffled CSV).
    shuffled = jobs[:]
    random.Random(5).shuffle(shuffled)
    store.upsert_many(shuffled, stagger=True)
    assert _scores(store, jobs) == first
    assert store.client.hlen(store.keys.defs) == N
    assert store.client.zcard(store.keys.schedule) == N


def test_import_with_jitter_adds_a_bounded_varying_delay_to_each_slot(
    make_store: Callable[..., Store],
) -> None:
    """With jitter, job i first runs in [now + i/N * interval, ... + jitter], still spread out."""
    jitter_s = 60
    store = make_store()
    store.rng = random.Random(1234)
    jobs = _jobs(jitter_s=jitter_s)
    before = store.now_ms()
    store.upsert_many(jobs, stagger=True)
    after = store.now_ms()
    scores = _scores(store, jobs)
    offsets = []
    for i, score in enumerate(scores):
        assert score is not None
        slot = int(i / N * INTERVAL_S * 1000)
        assert before + slot <= score <= after + slot + jitter_s * 1000
        offsets.append(int(score) - before - slot)
    assert len(set(offsets)) > N // 2, "jitter must vary per job"
    assert min(offsets) < 1000 and max(offsets) > (jitter_s - 1) * 1000
    dues = sorted(int(s) for s in scores if s is not None)
    assert dues[-1] - dues[0] > (INTERVAL_S + jitter_s / 2) * 1000
    per_second = Counter((d - before) // 1000 for d in dues)
    assert max(per_second.values()) <= 2 * N / INTERVAL_S
    # Re-importing with jitter still moves nothing.
    store.rng = random.Random(99)
    assert store.upsert_many(jobs, stagger=True).created == 0
    assert _scores(store, jobs) == scores
