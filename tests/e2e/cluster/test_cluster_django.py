"""The Django app on a Redis Cluster: reconcile rebuilds what a FLUSHALLed master held."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from celery_zsched.store.keys import partition_of
from e2e.cluster.conftest import CLUSTER_PARTITIONS, unique_prefix
from tests.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROWS = 120


@pytest.fixture
def on_cluster(settings: Any, cluster: LocalCluster) -> Iterator[None]:
    """Point the Django app's ``CELERY_ZSCHED_*`` settings at the shared cluster."""
    from celery_zsched.contrib.django import conf

    settings.CELERY_ZSCHED_REDIS_URL = cluster.url
    settings.CELERY_ZSCHED_REDIS_CLUSTER = True
    settings.CELERY_ZSCHED_PARTITIONS = CLUSTER_PARTITIONS
    settings.CELERY_ZSCHED_KEY_PREFIX = unique_prefix(cluster, "dj")
    settings.CELERY_ZSCHED_MAX_JITTER_S = 0
    conf.reset()
    yield
    conf.reset()


def test_zsched_sync_after_flushall_on_one_master_rebuilds_everything_it_held(
        on_cluster: None, cluster: LocalCluster) -> None:
    from celery_zsched.contrib.django import conf
    from celery_zsched.contrib.django.models import ZSchedJob

    # Saved through the ORM: each save reaches Redis on commit (the signals).
    for n in range(ROWS):
        row = ZSchedJob(url=f"http://127.0.0.1:1/dj/{n}", interval_s=600.0)
        row.full_clean()
        row.save()
    store = conf.get_store()
    ids = list(ZSchedJob.objects.values_list("job_id", flat=True))
    assert store.stats()["jobs"] == ROWS
    before = {info.job.id: info.due_ms for info in store.get_many(ids) if info}
    assert len(before) == ROWS

    # The master with the most of this store's partitions loses everything.
    owners = {i: cluster.master_of_key(keys.defs) for i, keys in enumerate(store.parts)}
    victim = max(set(owners.values()), key=list(owners.values()).count)
    held = [job_id for job_id in ids
            if owners[partition_of(job_id, CLUSTER_PARTITIONS)] == victim]
    assert 0 < len(held) < ROWS
    cluster.flushall(victim)
    assert store.stats()["jobs"] == ROWS - len(held)
    assert store.get_many(held) == [None] * len(held)

    out = io.StringIO()
    call_command("zsched_sync", stdout=out)
    print(f"\nreconcile after FLUSHALL on master {victim} ({len(held)} of {ROWS} jobs "
          f"lost):\n{out.getvalue()}")
    infos = store.get_many(ids)
    assert all(infos), [job_id for job_id, info in zip(ids, infos, strict=True) if not info]
    assert store.stats()["jobs"] == store.stats()["scheduled"] == ROWS
    # The jobs on the other masters kept their schedules; the rebuilt ones run again.
    kept = {i.job.id: i.due_ms for i in infos if i and i.job.id not in held}
    assert kept == {k: v for k, v in before.items() if k not in held}
    again = io.StringIO()
    call_command("zsched_sync", stdout=again)
    assert store.stats()["jobs"] == ROWS


def test_history_drain_on_the_cluster_records_each_settle_once(
        on_cluster: None, cluster: LocalCluster) -> None:
    from celery_zsched.contrib.django import conf, history
    from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun

    for n in range(40):
        row = ZSchedJob(url=f"http://127.0.0.1:1/drain/{n}", interval_s=600.0)
        row.full_clean()
        row.save()
    store = conf.get_store()
    ids = list(ZSchedJob.objects.values_list("job_id", flat=True))
    now = store.now_ms()
    for job_id in ids:
        store.client.zadd(store.part_of(job_id).schedule, {job_id: now}, xx=True)
    claimed = []
    while batch := store.claim(100).jobs:  # each partition gives its share per claim
        claimed += batch
    assert len(claimed) == 40
    for c in claimed:
        store.settle(c.job.id, c.occurrence, c.attempt, "complete", event={"task_id": c.task_id})
    first = history.drain()
    assert (first.read, first.created) == (40, 40)
    assert history.drain().read == 0  # every partition's cursor moved (WATCH on its node)
    assert sorted(ZSchedRun.objects.values_list("job_id", flat=True)) == sorted(ids)
