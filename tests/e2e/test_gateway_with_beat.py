"""Beat and the job gateway on one store: Celery jobs go only to Celery workers, HTTP
jobs only to HTTP workers (a Node.js worker on ``zsched serve``), and none to both."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from e2e.conftest import Deployment, TargetServer
from tests.gateway.conftest import LEASE_SECRET, TOKENS, WORKER
from tests.helpers import answers, free_port, wait

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js"),
]
WORKER_JS = Path(__file__).resolve().parents[1] / "gateway" / "worker.mjs"


def test_celery_jobs_and_http_jobs_each_reach_only_their_own_workers(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(api_tokens=TOKENS, gateway_lease_secret=LEASE_SECRET, gateway_timeout_s=5)
    celery_paths = ["/ok/c1", "/ok/c2"]
    http_paths = ["/ok/h1", "/ok/h2"]
    jobs = [d.job(url=target.url(p), interval_s=1, jitter_s=0) for p in celery_paths]
    jobs += [d.job(url=target.url(p), interval_s=1, jitter_s=0, transport="http")
             for p in http_paths]
    d.store.upsert_many(jobs, stagger=False)
    port = free_port()
    d._spawn("gateway", ["zsched", "serve", "--port", str(port), "--log-level", "warning"])
    d.start_beat()
    d.start_worker(pool="threads", concurrency=2)
    wait(lambda: answers(port), 120, "zsched serve to answer")
    node = subprocess.Popen(["node", str(WORKER_JS), f"http://127.0.0.1:{port}", WORKER],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        d.wait_for(lambda: all(len(target.hits(p)) >= 4 for p in celery_paths + http_paths),
                   40, "4 hits on every path")
    finally:
        node.kill()
        node.wait(5)
    # The Celery scrape task names its worker in the query; the Node worker adds nothing.
    for path in celery_paths:
        assert {hit.worker for hit in target.hits(path)} == {"worker"}, path
    for path in http_paths:
        assert {hit.worker for hit in target.hits(path)} == {None}, path
    # One run per settle, whoever ran it: no occurrence ran twice.
    for job in jobs:
        runs = [f for _id, f in d.store.events() if f["id"] == job.id]
        assert len({(f["occ"], f["attempt"]) for f in runs}) == len(runs), job.id
    worker_log = d.procs[-1].text()
    assert all(job.id not in worker_log for job in jobs if job.transport == "http")
    assert all(job.id in worker_log for job in jobs if job.transport == "celery")

