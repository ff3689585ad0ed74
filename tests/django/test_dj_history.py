"""drain(): run history from the settle stream, idempotent, mirrored, pruned."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from celery_zsched.contrib.django import history
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.core.job import Job
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def _run_all(store: Store, outcome: str = "complete", error: str = "") -> int:
    """Claim every due job and settle it with ``outcome``, as a worker would."""
    batch = store.claim()
    for c in batch.jobs:
        store.settle(c.job.id, c.occurrence, c.attempt, outcome, error=error, event={
            "task_id": c.task_id, "due_ms": c.due_ms, "promoted_ms": c.promoted_ms,
            "lateness_ms": c.promoted_ms - c.due_ms, "started_ms": c.promoted_ms + 5,
            "finished_ms": c.promoted_ms + 25, "wait_ms": 5, "duration_ms": 20})
    return len(batch.jobs)


def test_drain_records_each_settle_once_even_when_run_twice(
        zstore: Store, rclient: redis.Redis, make_row: Callable[..., ZSchedJob]) -> None:
    rows = [make_row(n) for n in range(3)]
    assert _run_all(zstore) == 3

    first = history.drain()
    assert (first.read, first.created) == (3, 3)
    assert history.drain().read == 0

    # Lose the cursor (as after a crash before it was written): nothing doubles.
    rclient.delete(zstore.keys.drain_cursor)
    replay = history.drain()
    assert (replay.read, replay.created) == (3, 0)
    assert ZSchedRun.objects.count() == 3

    run = ZSchedRun.objects.get(job_id=rows[0].job_id)
    assert run.job == rows[0]
    assert (run.status, run.attempt, run.wait_ms, run.duration_ms) == ("complete", 1, 5, 20)
    assert run.task_id and run.due_at and run.promoted_at and run.started_at
    assert run.lateness_ms is not None and run.lateness_ms >= 0
    assert run.stream_id == first.cursor or ZSchedRun.objects.filter(
        stream_id=first.cursor).exists()


def test_drain_refreshes_the_runtime_mirror_from_redis_state(
        zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(1, retry_max=0)
    _run_all(zstore, "error", error="HTTP 503")
    report = history.drain()
    assert report.jobs_updated == 1
    row.refresh_from_db()
    assert (row.last_status, row.last_error) == ("error", "HTTP 503")
    assert (row.run_count, row.failure_count, row.consecutive_failures) == (1, 1, 1)
    assert row.last_run_at is not None


def test_drain_in_small_batches_and_max_items(zstore: Store,
                                              make_job: Callable[..., Job]) -> None:
    zstore.upsert_many([make_job(n) for n in range(25)], stagger=False)
    _run_all(zstore)
    part = history.drain(max_items=10, batch=4)
    assert (part.read, part.created) == (10, 10)
    rest = history.drain(batch=4)
    assert (rest.read, rest.created) == (15, 15)
    assert ZSchedRun.objects.count() == 25


def test_settles_of_jobs_without_a_row_are_recorded(zstore: Store) -> None:
    zstore.upsert(Job.from_dict({"id": "beat-entry", "task": "t", "interval_s": 5}),
                  static=True)
    _run_all(zstore)
    history.drain()
    run = ZSchedRun.objects.select_related("job").get()
    assert run.job_id == "beat-entry" and run.job is None


def test_drain_prunes_history_older_than_the_setting(
        settings: Any, zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(1)
    now = timezone.now()
    ZSchedRun.objects.bulk_create([
        ZSchedRun(job_id=row.job_id, occurrence=i, status="complete",
                  finished_at=now - timedelta(days=days), stream_id=f"{i}-0")
        for i, days in enumerate((40, 31, 29, 1))])
    assert history.drain().pruned == 2
    assert sorted(ZSchedRun.objects.values_list("occurrence", flat=True)) == [2, 3]

    settings.CELERY_ZSCHED_HISTORY_DAYS = 0
    assert history.prune_history() == 0
    assert history.prune_history(days=2) == 1
    assert history.drain(prune=False).pruned == 0


def test_cursor_never_moves_backwards(zstore: Store) -> None:
    assert history.read_cursor(zstore) == "0"
    assert history.advance_cursor(zstore, "1700000000000-5")
    assert not history.advance_cursor(zstore, "1700000000000-4")
    assert not history.advance_cursor(zstore, "999-0")
    assert history.advance_cursor(zstore, "1700000000001-0")
    assert history.read_cursor(zstore) == "1700000000001-0"


def test_malformed_event_fields_do_not_stop_the_drain(zstore: Store,
                                                      rclient: redis.Redis) -> None:
    rclient.xadd(zstore.keys.events, {"id": "x", "occ": "12", "attempt": "1",
                                      "status": "skipped", "at": str(zstore.now_ms()),
                                      "data": "{not json"})
    assert history.drain().created == 1
    run = ZSchedRun.objects.get()
    assert (run.job_id, run.occurrence, run.task_id, run.wait_ms) == ("x", 12, "", None)


@pytest.mark.parametrize("bad", [
    {"data": '{"due_ms": 1000000000000000000000000000000}'},  # 10**30
    {"data": '{"started_ms": 1795488021269000}'},  # a worker's microseconds
    {"data": '{"wait_ms": -99999999999999999999}'},
    {"occ": "1e30"}, {"attempt": "99999999999"}, {"at": "9" * 40},
], ids=["due-1e30", "started-us", "wait-huge", "occ-1e30", "attempt-huge", "at-huge"])
def test_an_event_no_row_can_hold_is_skipped_counted_and_the_runs_after_it_recorded(
        zstore: Store, rclient: redis.Redis, make_row: Callable[..., ZSchedJob],
        bad: dict[str, str]) -> None:
    """One poison event never stops the run history: the drain logs and counts it
    (``history_skipped``, the exporter's ``zsched_history_skipped_events``), moves the
    cursor past it, and records every run after it, now and on the next drain."""
    rclient.xadd(zstore.keys.events, {"id": "poison", "occ": "12", "attempt": "1",
                                      "status": "complete", "at": str(zstore.now_ms()),
                                      "data": "{}", **bad})
    make_row(0)
    assert _run_all(zstore) == 1
    report = history.drain()
    assert (report.read, report.created, report.skipped) == (2, 1, 1)
    assert list(ZSchedRun.objects.values_list("job_id", flat=True)) != ["poison"]
    assert ZSchedRun.objects.count() == 1
    assert zstore.stats()["total_history_skipped"] == 1
    make_row(1)
    assert _run_all(zstore) >= 1
    again = history.drain()
    assert (again.skipped, again.created) == (0, again.read)
    assert not ZSchedRun.objects.filter(job_id="poison").exists()
