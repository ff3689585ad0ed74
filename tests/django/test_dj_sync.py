"""reconcile(): what no signal covers, a Redis that lost everything, dry runs, chunking."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_zsched.contrib.django import sync
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.job import Job
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def _bulk(make_job: Callable[..., Job], n: int, **fields: Any) -> list[ZSchedJob]:
    # bulk_create sends no signal: Redis does not hear of these rows.
    return ZSchedJob.objects.bulk_create(
        [ZSchedJob.from_job(make_job(i, **fields)) for i in range(n)])


def test_queryset_update_reaches_redis_through_reconcile(
        zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    rows = [make_row(n) for n in range(5)]
    ids = [row.job_id for row in rows]
    ZSchedJob.objects.filter(job_id__in=ids[:3]).update(interval_s=600, queue="slow")
    assert all(info and info.job.interval_s == 60 for info in zstore.get_many(ids))

    report = sync.reconcile()
    assert (report.changed, report.unchanged, report.missing) == (3, 2, 0)
    jobs = [info.job for info in zstore.get_many(ids) if info]
    assert [job.interval_s for job in jobs] == [600, 600, 600, 60, 60]
    assert [job.queue for job in jobs] == ["slow", "slow", "slow", None, None]
    again = sync.reconcile()
    assert (again.changed, again.missing, again.deleted) == (0, 0, 0)


def test_bulk_create_reaches_redis_through_reconcile(zstore: Store,
                                                     make_job: Callable[..., Job]) -> None:
    rows = _bulk(make_job, 10)
    assert zstore.stats()["jobs"] == 0
    report = sync.reconcile()
    assert report.missing == 10 and report.db_jobs == 10
    assert zstore.stats()["scheduled"] == 10
    assert {r.job_id for r in rows} == {job.id for job in zstore.iter_jobs()}


def test_disabled_rows_are_stored_paused(zstore: Store, make_job: Callable[..., Job]) -> None:
    _bulk(make_job, 4, enabled=False)
    sync.reconcile()
    stats = zstore.stats()
    assert (stats["jobs"], stats["paused"], stats["scheduled"]) == (4, 4, 0)


def test_dynamic_jobs_without_a_row_are_deleted_but_static_jobs_are_kept(
        zstore: Store, make_row: Callable[..., ZSchedJob], make_job: Callable[..., Job]) -> None:
    make_row(1)
    zstore.upsert(make_job(100))
    zstore.upsert(Job.from_dict({"id": "beat-entry", "task": "t", "interval_s": 5}),
                  static=True)

    dry = sync.reconcile(dry_run=True)
    assert (dry.deleted, dry.static_kept) == (1, 1)
    assert dry.samples["deleted"] == [make_job(100).id]
    assert zstore.stats()["jobs"] == 3

    kept = sync.reconcile(prune=False)
    assert kept.deleted == 0 and zstore.stats()["jobs"] == 3

    report = sync.reconcile()
    assert (report.deleted, report.static_kept) == (1, 1)
    assert {job.id for job in zstore.iter_jobs()} == {make_job(1).id, "beat-entry"}


def test_flushall_then_reconcile_rebuilds_redis_staggered_without_duplicates(
        zstore: Store, rclient: redis.Redis, make_job: Callable[..., Job]) -> None:
    n, interval = 200, 100.0
    _bulk(make_job, n, interval_s=interval)
    ZSchedJob.objects.bulk_create([ZSchedJob.from_job(make_job(999, enabled=False))])
    sync.reconcile()
    rclient.flushall()

    dry = sync.reconcile(dry_run=True)
    assert dry.missing == n + 1
    assert rclient.dbsize() == 0, "a dry run wrote to Redis"

    report = sync.reconcile()
    assert report.missing == n + 1
    assert zstore.stats()["jobs"] == n + 1
    assert zstore.stats()["paused"] == 1
    schedule = rclient.zrange(zstore.keys.schedule, 0, -1, withscores=True)
    assert len(schedule) == n == len({job_id for job_id, _ in schedule})
    dues = sorted(score for _, score in schedule)
    now = zstore.now_ms()
    # Spread over one interval: not all now, and no gap much wider than even spacing.
    assert dues[-1] - dues[0] >= 0.9 * interval * 1000
    assert dues[-1] <= now + interval * 1000
    largest_gap = max(b - a for a, b in itertools.pairwise(dues))
    assert largest_gap <= 3 * interval * 1000 / n

    again = sync.reconcile()
    assert (again.missing, again.changed, again.deleted) == (0, 0, 0)
    assert rclient.zcard(zstore.keys.schedule) == n


def test_runtime_mirror_is_copied_back_from_redis(
        zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(1)
    batch = zstore.claim()
    claimed = batch.jobs[0]
    zstore.settle(row.job_id, claimed.occurrence, claimed.attempt, "error", error="HTTP 500")
    dry = sync.reconcile(dry_run=True)
    assert dry.mirrored == 1
    row.refresh_from_db()
    assert row.failure_count == 0

    assert sync.reconcile().mirrored == 1
    row.refresh_from_db()
    assert (row.last_status, row.last_error) == ("retrying", "HTTP 500")
    assert (row.failure_count, row.consecutive_failures, row.run_count) == (1, 1, 0)
    assert row.last_run_at is not None
    assert sync.reconcile().mirrored == 0


def test_reconcile_is_chunked_not_one_round_trip_per_job(
        zstore: Store, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch) -> None:
    _bulk(make_job, 50)
    sync.reconcile()
    calls: list[int] = []
    original = Store.get_many

    def counting(self: Store, ids: Any) -> Any:
        calls.append(len(ids))
        return original(self, ids)

    monkeypatch.setattr(Store, "get_many", counting)
    sync.reconcile(chunk_size=16)
    assert calls == [16, 16, 16, 2]
    assert len(calls) == math.ceil(50 / 16)


def test_invalid_rows_are_reported_and_left_alone(zstore: Store) -> None:
    ZSchedJob.objects.bulk_create([ZSchedJob(job_id="bad", task="t", cron="nope")])
    report = sync.reconcile()
    assert report.invalid and report.invalid[0].startswith("bad: cron")
    assert zstore.get_many(["bad"]) == [None]
