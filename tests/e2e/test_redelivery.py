"""Deliveries that go wrong: a worker killed mid-task, a Celery retry, an expired message."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from celery_zsched.store import task_id_for
from e2e.conftest import Deployment, TargetServer, log_events

pytestmark = pytest.mark.slow


def test_worker_sigkilled_mid_task_is_redelivered_after_the_lease_with_the_same_task_id(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy(lease_s=3)
    path = "/slow/kill"
    # /slow sleeps 30 s on the first request of a task id only: the redelivery is fast.
    job = d.job(url=target.url(path + "?s=30"), interval_s=3600)
    d.store.upsert(job)
    beat = d.start_beat()
    first_worker = d.start_worker("worker1")

    first = d.wait_for(lambda: target.hits(path), 30, "the first delivery to reach /slow")[0]
    running = d.info(job.id)
    assert running.status == "running", running.state
    occurrence, attempt = running.state.occurrence, running.state.attempt
    assert first.task_id == task_id_for(job.id, occurrence, attempt)
    first_worker.kill()

    d.start_worker("worker2")
    d.wait_for(lambda: len(target.hits(path)) >= 2, 30, "the redelivery to reach /slow")
    info = d.wait_info(job.id, lambda i: i.status not in ("queued", "running"), 15,
                       "the redelivered occurrence to settle")

    second = target.hits(path)[1]
    assert second.task_id == first.task_id
    assert info.status == "scheduled", info.state
    assert info.state.runs == 1 and info.state.last_outcome == "complete", info.state
    assert info.state.occurrence != occurrence and info.state.attempt == 1, info.state
    settles = d.store.events()
    assert len(settles) == 1, settles
    fields = settles[0][1]
    assert (fields["occ"], fields["attempt"], fields["status"]) == (
        str(occurrence), str(attempt), "complete")
    assert json.loads(fields["data"])["task_id"] == first.task_id
    reaped = log_events(beat.text(), "reaped")
    assert [(r["redelivered"], r["ids"]) for r in reaped] == [(1, [job.id])], reaped
    assert len(target.hits(path)) == 2


def test_a_celery_retry_is_queued_again_and_settles_once_without_a_redelivery(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    # The 3 s countdown outlasts the 1.5 s execution lease: the occurrence goes back
    # to queued on task_retry, so beat does not reap it, and the retry's start runs.
    d = deploy(lease_s=1.5)
    path = "/ok/celery-retry"
    job = d.job(url=target.url(path), interval_s=3600, meta={"celery_retry_s": 3})
    d.store.upsert(job)
    worker = d.start_worker()
    d.wait_for(lambda: " ready." in worker.text(), 30, "the worker to be ready")
    beat = d.start_beat()

    d.wait_for(lambda: len(target.hits(path)) >= 2, 30, "the try and its Celery retry")
    info = d.wait_info(job.id, lambda i: i.status not in ("queued", "running"), 10,
                       "the retried task to settle")

    tried, retried = target.hits(path)
    assert retried.at - tried.at >= 2.9
    assert retried.task_id == tried.task_id
    assert info.status == "scheduled" and info.state.runs == 1, info.state
    assert info.state.last_outcome == "complete" and info.state.failures == 0, info.state
    assert [f["status"] for _id, f in d.store.events()] == ["complete"]
    assert log_events(beat.text(), "reaped") == []
    assert len(target.hits(path)) == 2


def test_a_message_expired_before_any_worker_took_it_settles_as_an_error(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy()
    path, control = "/ok/expires", "/ok/expires-later"
    job = d.job(url=target.url(path), interval_s=3600, expires_s=1)
    # Control: the same wait must not expire a message that lives for 60 s.
    later = d.job(url=target.url(control), interval_s=3600, expires_s=60)
    d.store.upsert_many([job, later], stagger=False)
    beat = d.start_beat()
    d.wait_for(lambda: sum(e["promoted"] for e in log_events(beat.text(), "poll_stats")) == 2,
               30, "beat to publish both jobs")
    published = time.monotonic()
    d.wait_for(lambda: time.monotonic() - published > 1.5, 5, "the first message to expire")
    d.start_worker()

    info = d.wait_info(job.id, lambda i: i.status not in ("queued", "running"), 30,
                       "the expiry to settle")
    d.wait_info(later.id, lambda i: i.state.runs == 1, 30, "the control job to run")

    assert target.hits(path) == [] and len(target.hits(control)) == 1
    assert info.state.failures == 1 and info.state.last_error == "expired", info.state
    assert info.state.last_outcome == "retrying", info.state
    settled = [(f["status"], f["error"]) for _id, f in d.store.events() if f["id"] == job.id]
    assert settled == [("retrying", "expired")]
