"""Processes that only looked dead change nothing; messages never promoted do not run.

Issue 18, with real beat and worker processes and the default lease (30 s):

* **Zombie.** A prefork worker's pool process is stopped (SIGSTOP) in the
  middle of a task, past its lease: the reaper gives the occurrence to
  another worker, which starts it under a new fence. When the stopped process
  resumes (SIGCONT), its heartbeat and its settle change nothing (one
  ``job_fenced`` line), and the new holder's settle applies.
* **Forged and malformed messages.** A message for an occurrence that is only
  scheduled, one under another task name, and one with malformed zsched
  headers: none runs its body (the target sees nothing), none changes its job,
  each is dropped with one log line and no traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from celery import Celery

from celery_zsched.core.results import task_id_for
from e2e.conftest import AMQP_URL, Deployment, TargetServer, log_events
from e2e.names import ENV_ACKS_LATE, ENV_BROKER_URL, OTHER_TASK, SCRAPE_TASK
from e2e.observe import settles, wait_ready
from tests.helpers import store_snapshot

pytestmark = pytest.mark.slow
#: How long the resumed zombie's and the new holder's runs take at the target.
RUN_S = 8


def test_a_worker_stopped_past_its_lease_changes_nothing_when_it_resumes(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy()  # the default lease: 30 s
    lease_ms = int(d.settings.lease_s * 1000)
    job = d.job(url=target.url(f"/sleep/zombie?s={RUN_S}"), interval_s=3600)
    d.store.upsert(job)
    # Late ack and one message at a time: the zombie's worker takes nothing else meanwhile,
    # so the occurrence goes to the other worker.
    a = d.start_worker("a", pool="prefork", concurrency=1, env={ENV_ACKS_LATE: "1"},
                       args=["--prefetch-multiplier", "1"])
    wait_ready(d, a)
    d.start_beat()
    d.wait_for(lambda: target.hits("/sleep/zombie"), 60, "worker a to start the job")
    started = d.info(job.id).state
    assert (started.status, started.fence) == ("running", 1)
    [child] = psutil.Process(a.pid).children()
    child.suspend()
    try:
        b = d.start_worker("b", pool="prefork", concurrency=1)
        wait_ready(d, b)
        # One lease without a heartbeat: reaped, redelivered to b, started under fence 2.
        taken = d.wait_info(job.id, lambda info: info.state.fence == 2, lease_ms / 1000 + 60,
                            "worker b to start the occurrence a stalled on")
        assert (taken.state.status, taken.state.occurrence) == ("running", started.occurrence)
        assert taken.state.crashes == 1
        d.wait_for(lambda: len(target.hits("/sleep/zombie")) == 2, 30, "b's run at the target")
        before = store_snapshot(d.store)
    finally:
        child.resume()
    # a's run answers at once (its response waited in the socket): it settles, fenced off.
    d.wait_for(lambda: log_events(a.text(), "job_fenced"), 30, "a's settle to be refused")
    mid = store_snapshot(d.store)
    assert mid["state"] == before["state"] and mid["schedule"] == before["schedule"]
    assert mid["events"] == before["events"] == 0, "no settle applied while b runs"
    # b finishes: its settle applies, once.
    done = d.wait_info(job.id, lambda info: info.state.runs == 1, RUN_S + 30, "b's settle")
    assert done.state.status == "scheduled" and done.state.last_outcome == "complete"
    [event] = settles(d)
    assert json.loads(event["data"])["task_id"] == task_id_for(job.id, started.occurrence, 1)
    [fenced] = log_events(a.text(), "job_fenced")
    assert (fenced["job_id"], fenced["fence"]) == (job.id, 1)
    # b's log line follows its settle: the reply is read after the settle applied.
    completes = d.wait_for(lambda: log_events(b.text(), "job_complete"), 30,
                           "b's job_complete line")
    assert [e["applied"] for e in completes] == [True]
    assert d.store.stats()["total_redelivered"] == 1


def _sender(d: Deployment) -> Celery:
    app = Celery("forger", broker=d.env[ENV_BROKER_URL], set_as_current=False)
    app.conf.task_default_queue = d.queue
    return app


def _forge(app: Celery, task: str, url: str, headers: dict[str, Any]) -> None:
    app.send_task(task, kwargs={"url": url, "meta": {}}, headers=headers, queue=None)


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_forged_and_malformed_messages_do_not_run_and_change_no_job(
        broker: str, deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(broker=broker)
    if broker == "amqp":
        assert d.env[ENV_BROKER_URL] == AMQP_URL
    scheduled = d.job(url=target.url("/ok/forged/scheduled"), interval_s=60,
                      start_at=1_893_456_000)  # 2030: scheduled, never promoted
    queued = d.job(url=target.url("/ok/forged/queued"), interval_s=60)
    d.store.upsert_many([scheduled, queued], stagger=False)
    # The queued job is claimed and its publish confirmed, as beat does; its real
    # message is never sent, so only the forged ones could run it.
    [claimed] = d.store.claim().jobs
    assert claimed.job.id == queued.id
    d.store.routed([(claimed, d.queue)])
    future = d.info(scheduled.id).state
    before = store_snapshot(d.store)
    worker = d.start_worker("w", pool="prefork", concurrency=2)
    wait_ready(d, worker)
    app = _sender(d)
    try:
        # The right occurrence of a job that is only scheduled.
        _forge(app, SCRAPE_TASK, scheduled.url or "", {
            "zsched_job_id": scheduled.id, "zsched_occurrence": future.occurrence,
            "zsched_attempt": 1, "zsched_delivery": 1, "zsched_due_ms": future.occurrence,
            "zsched_promoted_ms": future.occurrence})
        # The queued occurrence, under another task.
        _forge(app, OTHER_TASK, queued.url or "", claimed.headers())
        # Malformed headers: not numbers, and numbers out of every range.
        _forge(app, SCRAPE_TASK, queued.url or "", {**claimed.headers(),
                                                    "zsched_occurrence": "abc"})
        _forge(app, SCRAPE_TASK, queued.url or "", {**claimed.headers(), "zsched_due_ms": 2**60})
        _forge(app, SCRAPE_TASK, queued.url or "", {"zsched_job_id": queued.id})
        d.wait_for(lambda: len(log_events(worker.text(), "job_refused")) == 2
                   and len(log_events(worker.text(), "job_malformed_dropped")) == 3,
                   30, "the worker to drop all five")
    finally:
        app.close()
    time.sleep(0.5)  # a body that ran anyway would have reached the target by now
    assert target.hits_under("/ok/forged/") == []
    after = store_snapshot(d.store)
    assert {k: v for k, v in after.items() if k not in ("counters", "keys")} == \
        {k: v for k, v in before.items() if k not in ("counters", "keys")}
    refused = log_events(worker.text(), "job_refused")
    assert sorted(e["reason"] for e in refused) == ["task", "unpromoted"]
    assert int(after["counters"].get("refused", 0)) == 2
    assert "Traceback" not in worker.text()
    # The real message of the queued occurrence still runs, once.
    app = _sender(d)
    try:
        app.send_task(SCRAPE_TASK, kwargs={"url": queued.url, "meta": {}},
                      headers=claimed.headers(), task_id=claimed.task_id)
    finally:
        app.close()
    d.wait_info(queued.id, lambda info: info.state.runs == 1, 30, "the real message to run")
    assert len(target.hits("/ok/forged/queued")) == 1
