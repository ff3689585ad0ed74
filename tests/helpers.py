"""Helpers shared by several test modules."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from celery_zsched.job import Job
from celery_zsched.store import Store

T = TypeVar("T")


def store_snapshot(store: Store) -> dict[str, Any]:
    """Everything a write could change, read with the store's own key names.

    Comparing two snapshots proves a rejected or stale operation wrote nothing.
    """
    c, k = store.client, store.keys
    return {
        "defs": c.hgetall(k.defs),
        "state": c.hgetall(k.state),
        "schedule": c.zrange(k.schedule, 0, -1, withscores=True),
        "queued": c.zrange(k.queued, 0, -1, withscores=True),
        "leases": c.zrange(k.leases, 0, -1, withscores=True),
        "paused": c.smembers(k.paused),
        "dead": c.zrange(k.dead, 0, -1, withscores=True),
        "static": c.smembers(k.static),
        "events": c.xlen(k.events),
        "counters": c.hgetall(k.counters),
        "keys": c.exists(*k.all()),
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait(predicate: Callable[[], T | None], timeout: float, what: str,
         interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def settle_all(store: Store, host: str, count: int, outcome: str, status: int,
               retry_after_s: float | None = None) -> None:
    """``count`` jobs on ``host`` run once and answer ``status``, as workers report it."""
    jobs = [Job.from_dict({"id": f"{host}-{n}-{uuid.uuid4().hex[:6]}",
                           "url": f"https://{host}/{n}", "interval_s": 3600, "jitter_s": 0},
                          store.defaults) for n in range(count)]
    store.upsert_many(jobs)
    store.run_now(*[job.id for job in jobs])
    claimed = [c for c in store.claim().jobs if c.job.id in {job.id for job in jobs}]
    assert len(claimed) == count
    for c in claimed:
        store.settle(c.job.id, c.occurrence, c.attempt, outcome, error=f"HTTP {status}",
                     http_status=status, retry_after_s=retry_after_s)
