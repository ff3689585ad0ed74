"""The listing behind ``GET /v1/jobs`` on a real Redis Cluster: partitions on three masters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celery_zsched.store import Store
from celery_zsched.store.listing import JobFilter
from tests.test_listing import brute_force, finish_rehash, fleet, walk, walked_ids

pytestmark = pytest.mark.slow


def test_a_walk_on_a_cluster_returns_every_job_once_and_filters_match(
        cluster_store: Callable[..., Store]) -> None:
    store = cluster_store()
    specs = fleet(store, 500)
    store.pause(*sorted(specs)[::10])
    finish_rehash(store, list(specs))
    assert sorted(walked_ids(walk(store, JobFilter(), 13))) == sorted(specs)
    for flt in (JobFilter(status="paused"), JobFilter(kind="cron", queue="eu"),
                JobFilter(status="scheduled", transport="http")):
        expected = brute_force(store, specs, flt)
        assert expected and sorted(walked_ids(walk(store, flt, 20))) == sorted(expected)
