"""The start compare-and-set and the heartbeat work in every worker pool.

For each pool (prefork, Celery's default; threads; solo; gevent; eventlet) a
task that runs four times its execution lease is delivered twice (the broker
holds a copy of its message): it runs once, the copy is dropped without
running, the lease never runs out, and the occurrence settles once.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest

from e2e.conftest import Deployment, TargetServer, log_events

pytestmark = pytest.mark.slow

LEASE_S = 1.0
TASK_S = 4 * LEASE_S
POOLS = ["prefork", "threads", "solo", "gevent", "eventlet"]


def _installed(pool: str) -> bool:
    return pool not in ("gevent", "eventlet") or importlib.util.find_spec(pool) is not None


@pytest.mark.parametrize("pool", POOLS)
def test_a_duplicated_message_of_a_long_task_runs_once_in_every_pool(
        deploy: Callable[..., Deployment], target: TargetServer, pool: str) -> None:
    if not _installed(pool):
        pytest.skip(f"{pool} is not installed")
    d = deploy(lease_s=LEASE_S)
    path = f"/slow/{pool}"
    job = d.job(url=target.url(f"{path}?s={TASK_S}"), interval_s=3600)
    d.store.upsert(job)
    beat = d.start_beat()
    queue = d.queue.encode()
    d.wait_for(lambda: d.broker.llen(queue) == 1, 30, "beat to publish the message")
    # A second copy of the same message, as a broker redelivery would make.
    d.broker.lpush(queue, d.broker.lindex(queue, 0) or b"")
    worker = d.start_worker(pool=pool, concurrency=1 if pool == "solo" else 2)

    info = d.wait_info(job.id, lambda i: i.state.runs == 1, 30 + TASK_S,
                       "the long task to settle")
    d.wait_for(lambda: log_events(worker.text(), "job_duplicate_dropped"), 15,
               "the copy to be dropped")

    hits = target.hits(path)
    assert len(hits) == 1, hits
    assert info.status == "scheduled" and info.state.last_outcome == "complete", info.state
    assert info.state.crashes == 0, "the heartbeat kept the lease: no crash counted"
    dropped = log_events(worker.text(), "job_duplicate_dropped")
    assert [(e["job_id"], e["task_id"]) for e in dropped] == [(job.id, hits[0].task_id)]
    assert [f["status"] for _id, f in d.store.events()] == ["complete"]
    assert log_events(beat.text(), "reaped") == []
    counters = d.store.client.hgetall(d.store.keys.counters)
    assert (counters.get("started"), counters.get("duplicates")) == ("1", "1"), counters
