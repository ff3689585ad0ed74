"""The Django app on a partitioned store (``CELERY_ZSCHED_PARTITIONS = 4``): the
admin's one-round-trip page, the import command, reconcile after a Redis that lost
everything, and the run-history drain (one cursor per partition)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf, history, sync
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.django.test_admin import CHANGELIST, bulk_jobs, changelist_ids, count_round_trips

pytestmark = pytest.mark.django_db(transaction=True)

P = 4


@pytest.fixture
def pstore(zsched_redis: None, settings: Any) -> Iterator[Store]:
    """The Django app's store, split into four partitions."""
    settings.CELERY_ZSCHED_PARTITIONS = P
    conf.reset()
    store = conf.get_store()
    assert store.partitions == P
    yield store
    conf.reset()


def _scheduled(store: Store) -> dict[str, float]:
    """Every scheduled job id -> due ms, over all partitions."""
    out: dict[str, float] = {}
    for keys in store.parts:
        out.update(store.client.zrange(keys.schedule, 0, -1, withscores=True))
    return out


def test_admin_page_reads_every_partition_in_one_round_trip(
        admin_client: Client, pstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    bulk_jobs(pstore, 40)
    occupied = {pstore.part_of(job_id).prefix for job_id in _scheduled(pstore)}
    assert len(occupied) == P  # the page's rows really come from four partitions
    pstore.client.ping()
    with count_round_trips(monkeypatch) as trips:
        response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert trips.count == 1
    ids = changelist_ids(response)
    infos = pstore.get_many(ids)
    assert len(ids) == len(infos) > 0
    assert all(info is not None and info.due_ms for info in infos)
    assert response.context["cl"].result_count == 40


def test_import_command_spreads_jobs_over_partitions(
        pstore: Store, tmp_path: Any) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(f'{{"url": "http://127.0.0.1:1/i/{n}", "interval_s": 600}}\n'
                            for n in range(300)))
    call_command("zsched_import", "--file", str(path), stdout=StringIO(), stderr=StringIO())
    dues = _scheduled(pstore)
    assert len(dues) == 300 == ZSchedJob.objects.count()
    sizes = [pstore.client.hlen(keys.defs) for keys in pstore.parts]
    assert sum(sizes) == 300 and min(sizes) > 40, sizes
    now = pstore.now_ms()
    spread = sorted(dues.values())
    assert spread[0] < now + 60_000 and spread[-1] > now + 400_000  # staggered over 600 s


def test_reconcile_after_flushall_rebuilds_every_partition(
        pstore: Store, rclient: redis.Redis, make_job: Callable[..., Job]) -> None:
    ZSchedJob.objects.bulk_create([ZSchedJob.from_job(make_job(i, interval_s=100.0))
                                   for i in range(200)])
    sync.reconcile()
    assert len(_scheduled(pstore)) == 200
    rclient.flushall()
    report = sync.reconcile()
    assert report.missing == 200
    dues = _scheduled(pstore)
    assert len(dues) == 200 and pstore.stats()["jobs"] == 200
    assert {pstore.part_of(job_id).prefix for job_id in dues} == {k.prefix for k in pstore.parts}
    assert sync.reconcile().missing == 0


def test_history_drain_reads_each_partitions_stream_once(
        pstore: Store, rclient: redis.Redis, make_row: Callable[..., ZSchedJob]) -> None:
    rows = [make_row(n) for n in range(24)]
    now = pstore.now_ms()
    for row in rows:
        rclient.zadd(pstore.part_of(row.job_id).schedule, {row.job_id: now}, xx=True)
    batch = pstore.claim(100)
    assert len(batch.jobs) == 24
    for c in batch.jobs:
        pstore.settle(c.job.id, c.occurrence, c.attempt, "complete",
                      event={"task_id": c.task_id})
    first = history.drain()
    assert (first.read, first.created) == (24, 24)
    assert history.drain().read == 0
    # Lose every cursor (a crash before they were written): nothing doubles.
    for keys in pstore.parts:
        rclient.delete(keys.drain_cursor)
    replay = history.drain()
    assert (replay.read, replay.created) == (24, 0)
    runs = list(ZSchedRun.objects.values_list("job_id", "stream_id"))
    assert sorted(job_id for job_id, _ in runs) == sorted(row.job_id for row in rows)
    # Entry ids repeat across partition streams; the partition makes them unique.
    assert {stream_id.split("/")[0] for _, stream_id in runs} == {str(i) for i in range(P)}
