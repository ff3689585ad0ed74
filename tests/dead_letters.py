"""Make dead letters the way a fleet does: a job fails once (so it has a last
error), runs again, and its worker dies under it until the reaper gives up.

The store must have a tiny ``lease_s`` (the execution lease that runs out)
and ``max_deliveries=1`` (one crash is enough).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from celery_zsched.core.job import Job
from celery_zsched.store import Claimed, Store


def dead_job(job_id: str, **fields: object) -> Job:
    data: dict[str, object] = {"id": job_id, "task": "tests.noop", "name": f"job {job_id}",
                               "url": f"https://example.test/{job_id}", "interval_s": 3600,
                               "jitter_s": 0, "retry_max": 0}
    data.update(fields)
    return Job.from_dict(data)


def _claim_all(store: Store, ids: set[str]) -> list[Claimed]:
    claimed: list[Claimed] = []
    for _ in range(10):  # each partition gets its share of a claim
        claimed += [c for c in store.claim(1000).jobs if c.job.id in ids]
        if len(claimed) >= len(ids):
            break
    assert {c.job.id for c in claimed} == ids
    return claimed


def kill(store: Store, jobs: Sequence[Job], error: str = "HTTP 503: upstream down") -> None:
    """Store ``jobs`` and dead-letter every one of them."""
    assert store.settings.max_deliveries == 1 and store.settings.lease_s < 1
    ids = {job.id for job in jobs}
    store.upsert_many(jobs, stagger=False)
    store.run_now(*ids)
    for c in _claim_all(store, ids):
        assert store.start(c.job.id, c.occurrence, c.attempt).runs
        assert store.settle(c.job.id, c.occurrence, c.attempt, "error", error=error).applied
    store.run_now(*ids)
    for c in _claim_all(store, ids):
        assert store.start(c.job.id, c.occurrence, c.attempt).runs
    time.sleep(store.settings.lease_s + 0.03)
    assert store.reap().dead == len(ids)
