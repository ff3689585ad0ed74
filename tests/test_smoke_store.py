"""A first round trip through the store: upsert, claim, settle."""

from celery_zsched.core.job import Job
from celery_zsched.store import Store


def test_upsert_claim_settle_round_trip(store: Store) -> None:
    job = Job.from_dict({"url": "http://127.0.0.1:1/a", "interval_s": 10})
    assert store.upsert(job).created == 1
    batch = store.claim()
    assert [c.job.id for c in batch.jobs] == [job.id]
    claimed = batch.jobs[0]
    result = store.settle(job.id, claimed.occurrence, claimed.attempt, "complete")
    assert result.applied and result.status == "scheduled"
    assert result.next_due_ms is not None
    assert result.next_due_ms - batch.now_ms >= 10_000
