"""Helpers shared by several test modules."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from celery_zsched.core.job import Job
from celery_zsched.store import Store

T = TypeVar("T")


def store_snapshot(store: Store) -> dict[str, Any]:
    """Everything a write could change, read with the store's own key names.

    Comparing two snapshots proves a rejected or stale operation wrote nothing.
    """
    c, k = store.client, store.keys
    return {
        "defs": c.hgetall(k.defs),
        # Decoded: a script that rewrites a state unchanged may order its keys anew.
        "state": {job_id: json.loads(raw) for job_id, raw in c.hgetall(k.state).items()},
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


def worker_share(ports: range) -> range:
    """This pytest-xdist worker's own slice of ``ports`` (all of it without xdist).

    A test that kills a server frees its port; were the other worker to start a
    server on it meanwhile, the test would find its "dead" server alive (a CI
    Sentinel never failed over). Disjoint slices rule that out.
    """
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(name[2:]) if name.startswith("gw") else 0
    size = len(ports) // max(count, 1)
    return ports[index * size:(index + 1) * size]


def bindable(port: int) -> bool:
    """Whether nothing listens on ``port`` of 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


#: Below the cluster nodes' ports (tests/cluster.py) and the kernel's ephemeral
#: range (32768 and up), where the OS picks client ports.
_FREE_PORTS = range(2000, 12000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, from this
    worker's share."""
    share = worker_share(_FREE_PORTS)
    for _ in range(1000):
        port = random.choice(share)
        if bindable(port):
            return port
    raise AssertionError("no free port")


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


#: The marks of a test that runs a script of benchmarks/ as a person does (a
#: subprocess that starts its own redis-servers and Celery processes).
BENCHMARK_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def run_benchmark(script: str, *args: str, timeout: float) -> list[list[str]]:
    """Run ``benchmarks/<script>`` with ``args``; the cells of each row of the
    markdown tables it printed. Fails unless it exits 0.

    Inherited zsched and Celery settings, and pytest-django's
    ``DJANGO_SETTINGS_MODULE``, are left out of its environment.
    """
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZSCHED_", "CELERY_", "DJANGO_SETTINGS_MODULE"))}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=root,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return [line.strip("| ").split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ")]


def answers(port: int) -> bool:
    """Whether an HTTP server answers on ``port`` (asked without a token: a probe of the
    gateway must not take a job)."""
    import httpx

    try:
        httpx.get(f"http://127.0.0.1:{port}/jobs/next", timeout=1)
    except httpx.HTTPError:
        return False
    return True
