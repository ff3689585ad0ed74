"""A worker written in Node.js against a real ``zsched serve`` process and a local target.

The worker (``worker.mjs``, Node's built-in fetch only) long-polls, fetches the
job's URL and reports. Its jobs run on their cadence, its errors retry with
backoff, and a worker killed mid-job gets its job back after the lease.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.e2e.conftest import TargetServer
from tests.gateway.conftest import WORKER, serve_process, stop_process
from tests.helpers import free_port, wait

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js"),
]
WORKER_JS = Path(__file__).with_name("worker.mjs")


@pytest.fixture
def target() -> Iterator[TargetServer]:
    """A local HTTP target (``/ok``, ``/fail``, ``/429``, ``/sleep``) recording its hits."""
    import threading

    server = TargetServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


class Deployment:
    """A ``zsched serve`` process, its store, and Node.js workers started against it."""

    def __init__(self, redis_url: str, rclient: redis.Redis, log_level: str = "warning",
                 **settings: Any) -> None:
        self.prefix = "{gw" + uuid.uuid4().hex[:8] + "}:"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = Store(rclient, Settings(redis_url=redis_url, key_prefix=self.prefix,
                                             max_jitter_s=0, **settings))
        self.server = serve_process(redis_url, self.prefix, self.port, log_level, **settings)
        self.workers: list[subprocess.Popen[str]] = []
        self.output: str | None = None

    def worker(self, batch: int = 1) -> subprocess.Popen[str]:
        """Start one Node.js worker (``batch`` > 1: it polls and reports in batches)."""
        proc = subprocess.Popen(["node", str(WORKER_JS), self.url, WORKER, "", str(batch)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.workers.append(proc)
        return proc

    def close(self) -> str:
        """Stop the workers and the server (SIGTERM); the server's output."""
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        if self.output is None:
            self.output = stop_process(self.server)
        return self.output


@pytest.fixture
def deploy(redis_url: str, rclient: redis.Redis) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(**settings: Any) -> Deployment:
        made.append(Deployment(redis_url, rclient, **settings))
        return made[-1]

    yield make
    for deployment in made:
        deployment.close()


def _job(job_id: str, url: str, **fields: Any) -> Job:
    return Job.from_dict({"id": job_id, "url": url, "transport": "http", "jitter_s": 0,
                          **fields})


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 2) for a, b in itertools.pairwise(times)]


def test_a_node_worker_runs_jobs_on_their_cadence(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(gateway_timeout_s=5, log_level="info")
    d.store.upsert_many([_job("a", target.url("/ok/a"), interval_s=1),
                         _job("b", target.url("/ok/b"), interval_s=1.5)], stagger=False)
    d.worker()
    wait(lambda: len(target.hits("/ok/a")) >= 5, 15, "five runs of a")
    for path, interval in (("/ok/a", 1.0), ("/ok/b", 1.5)):
        gaps = _gaps(target.times(path))
        # The next run counts from the settle: interval plus one request's time.
        assert gaps and all(interval - 0.05 <= gap < interval + 0.3 for gap in gaps), (path, gaps)
    info = d.store.get("a")
    assert info.state.runs >= 4 and info.state.crashes == 0
    assert info.status in ("scheduled", "running")
    # The server logs each report as the Celery path does: one JSON event a line.
    events = [json.loads(line.split("job_complete ", 1)[1])
              for line in d.close().splitlines() if "job_complete {" in line]
    assert {e["job_id"] for e in events} == {"a", "b"}
    assert all(e["applied"] and e["duration_ms"] >= 0 for e in events)


def test_a_node_workers_errors_retry_with_backoff(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(gateway_timeout_s=5, retry_base_s=0.4, retry_max=3)
    d.store.upsert_many([_job("f", target.url("/fail/f"), interval_s=3600),
                         _job("r", target.url("/429/r?after=1"), interval_s=3600)],
                        stagger=False)
    d.worker()
    wait(lambda: len(target.hits("/fail/f")) >= 4, 15, "the first run and three retries")
    gaps = _gaps(target.times("/fail/f"))
    # 0.4, 0.8, 1.6 s: each retry doubles the delay (plus a request's time).
    assert [round(g / 0.4) for g in gaps] == [1, 2, 4], gaps
    time.sleep(0.5)
    assert len(target.hits("/fail/f")) == 4  # retries spent: the next regular run is in 1 h
    state = d.store.get("f").state
    assert state.last_error == "HTTP 500" and state.consecutive_failures == 4
    # A 429's Retry-After (1 s) sets the retry delay instead of the backoff.
    wait(lambda: len(target.hits("/429/r")) >= 2, 10, "the 429 job's retry")
    assert _gaps(target.times("/429/r"))[0] == pytest.approx(1.0, abs=0.3)


def test_a_node_worker_in_batch_mode_settles_every_job_once(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(gateway_timeout_s=5, retry_max=0)
    ids = [f"n{n}" for n in range(30)]
    d.store.upsert_many([_job(i, target.url(f"/ok/{i}"), interval_s=3600) for i in ids]
                        + [_job("bad", target.url("/fail/bad"), interval_s=3600)],
                        stagger=False)
    proc = d.worker(batch=8)
    wait(lambda: all(d.store.get(i).state.runs == 1 for i in ids)
         and d.store.get("bad").state.last_error == "HTTP 500", 20, "every job to run")
    proc.kill()
    assert proc.stdout is not None
    lines = [json.loads(line) for line in proc.stdout.read().splitlines()
             if line.startswith("{")]
    reported = [line for line in lines if line["event"] == "reported"]
    assert sorted(line["id"] for line in reported) == sorted([*ids, "bad"])  # each once
    assert all(line["status"] == 200 and line["answer"]["applied"] for line in reported)
    assert {line["answer"]["outcome"] for line in reported if line["id"] == "bad"} == {"error"}
    # In batches: more than one job per request.
    assert max(line["batch"] for line in reported) > 1
    assert all(len(target.hits(f"/ok/{i}")) == 1 for i in ids)


def test_a_node_worker_killed_mid_job_gets_its_job_back_after_the_lease(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(gateway_timeout_s=5, gateway_lease_s=2)
    d.store.upsert(_job("slow", target.url("/sleep/slow?s=30"), interval_s=3600))
    first = d.worker()
    wait(lambda: target.hits("/sleep/slow"), 10, "the first worker to start the job")
    claimed = d.store.get("slow")
    assert claimed.status == "running"
    first.send_signal(signal.SIGKILL)
    first.wait(5)
    killed = time.monotonic()
    d.worker()
    wait(lambda: len(target.hits("/sleep/slow")) >= 2, 10, "the job to come back")
    back_after = target.hits("/sleep/slow")[1].at - killed
    # The lease (2 s) plus the reaper's second and a poll, with slack for a loaded CI.
    assert back_after < 2 + 4
    state = d.store.get("slow").state
    assert state.crashes == 1 and state.occurrence == claimed.state.occurrence
    assert state.publishes == 2


def test_zsched_serve_answers_waiting_polls_503_on_sigterm_and_exits(
        deploy: Callable[..., Deployment]) -> None:
    d = deploy(gateway_timeout_s=20)
    out: dict[str, Any] = {}

    def poll() -> None:
        import httpx

        started = time.monotonic()
        res = httpx.get(f"{d.url}/jobs/next", headers={"Authorization": f"Bearer {WORKER}"},
                        timeout=30)
        out.update(status=res.status_code, after=time.monotonic() - started,
                   retry=res.headers.get("Retry-After"))

    import threading

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    d.server.send_signal(signal.SIGTERM)
    thread.join(10)
    assert out["status"] == 503 and out["retry"] and out["after"] < 3
    # uvicorn ends by re-raising the signal it handled: a clean stop, by SIGTERM.
    assert d.server.wait(10) in (0, -signal.SIGTERM)
