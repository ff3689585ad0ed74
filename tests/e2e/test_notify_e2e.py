"""Notifications from real processes: a prefork worker's child posts a failure, beat
posts a dead letter, both signed, to a local receiver."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from e2e.conftest import Deployment, TargetServer
from tests.webhook_receiver import Receiver, running_receiver

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """The webhook receiver (secret ``s3cret``)."""
    with running_receiver("s3cret") as got:
        yield got


def test_a_prefork_child_posts_a_failure_and_beat_posts_a_dead_letter(
        deploy: Callable[..., Deployment], target: TargetServer, receiver: Receiver) -> None:
    d = deploy(retry_max=0, lease_s=1.5, max_deliveries=1, notify_webhook_url=receiver.url,
               notify_webhook_secret="s3cret",
               notify_events="job_retries_exhausted,job_dead_lettered")
    failing = d.job(url=target.url("/fail/a"), interval_s=3600)
    hanging = d.job(url=target.url("/sleep/b?s=30"), interval_s=3600)
    d.store.upsert_many([failing, hanging], stagger=False)
    d.start_beat()
    worker = d.start_worker(pool="prefork", concurrency=2)

    (failed,) = d.wait_for(lambda: receiver.of("job_retries_exhausted") or None, 20,
                           "the failure notice from the worker")
    assert failed.verified and failed.body["job_id"] == failing.id
    assert failed.body["error"].startswith("TargetError: HTTP 500")

    d.wait_for(lambda: target.hits("/sleep/b") or None, 10, "the hanging job to start")
    worker.crash()  # the machine is lost mid-task: only the lease brings it back
    (dead,) = d.wait_for(lambda: receiver.of("job_dead_lettered") or None, 15,
                         "the dead-letter notice from beat")
    assert dead.verified and dead.body["job_id"] == hanging.id
    assert "crashed executions" in dead.body["error"]
    assert d.info(hanging.id).status == "dead"
    assert len(receiver.posts) == 2
