"""Beat and a worker on a Sentinel-managed store carry on after the master fails over."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store
from e2e.conftest import Deployment, TargetServer, wait_for
from tests.servers import SentinelGroup, sentinel_group

pytestmark = pytest.mark.slow

BACKOFF = "zsched: unavailable (attempt"


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    """Master, replica and Sentinel; requested before ``deploy``, so they outlive its processes."""
    with sentinel_group(tmp_path / "sentinel") as group:
        yield group


def redis_now_ms(store: Store) -> int:
    """Redis' clock through ``store``, retried while the store is failing over."""
    def now() -> int | None:
        try:
            return store.now_ms()
        except StoreUnavailable:
            return None
    return wait_for(now, 30, "the store to answer after the failover", interval=0.2)


def test_beat_and_worker_carry_on_after_the_master_fails_over(
        sentinels: SentinelGroup, deploy: Callable[..., Deployment],
        target: TargetServer) -> None:
    # Short lease and delivery deadline: a start or settle that replication lost
    # is redelivered within seconds, so "every job settles again" needs no luck.
    d = deploy(store_url=sentinels.url, sentinel_master=sentinels.name, lease_s=3,
               delivery_timeout_s=10)
    assert d.store.client.connection_pool.service_name == sentinels.name
    paths = [f"/ok/sentinel-{i}" for i in range(4)]
    jobs = [d.job(url=target.url(p), interval_s=1) for p in paths]
    d.store.upsert_many(jobs, stagger=False)
    beat = d.start_beat()
    d.start_worker()
    d.wait_for(lambda: all(len(target.hits(p)) >= 2 for p in paths), 40,
               "two runs of every job before the failover")

    old_port = sentinels.master_port()
    assert old_port == sentinels.master.port
    sentinels.master.stop()  # SIGKILL: no goodbye, no last replication
    killed = time.monotonic()
    new_port = sentinels.wait_failover(old_port)
    assert new_port == sentinels.replica.port
    promoted = time.monotonic()
    failover_ms = redis_now_ms(d.store)  # the new master's clock

    d.wait_for(lambda: all(len([t for t in target.times(p) if t > promoted]) >= 2
                           for p in paths), 60, "two runs of every job after the failover")
    # No occurrence lost: every job settled again, on the new master.
    infos = d.wait_for(
        lambda: (lambda got: got if all(i.state.last_settled_ms and
                                        i.state.last_settled_ms > failover_ms
                                        for i in got) else None)(
            [d.info(job.id) for job in jobs]),
        30, "every job to settle on the new master")
    assert all(i.state.status != "dead" for i in infos), [i.state for i in infos]
    assert all(i.state.last_outcome == "complete" for i in infos), [i.state for i in infos]
    assert beat.alive()
    # Beat noticed the outage and backed off rather than crashing or spinning.
    assert BACKOFF in beat.text()
    task_ids = Counter(h.task_id for p in paths for h in target.hits(p))
    duplicates = {tid: n for tid, n in task_ids.items() if n > 1}
    print(f"failover: master {old_port} -> {new_port} in {promoted - killed:.1f}s; "
          f"{sum(task_ids.values())} runs, duplicate task ids (allowed): {duplicates}")
