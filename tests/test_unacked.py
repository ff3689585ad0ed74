"""Beat's sweep of the Redis broker's unacked index, against real kombu and Redis.

A consumer takes a zsched message from a Redis broker and is never heard of
again, before any heartbeat recorded its hold: the message sits in kombu's
``unacked`` hash for the visibility timeout (an hour). The sweep finds it a
lease later and makes its occurrence due again; it leaves alone entries that
are younger than a lease, messages a live worker holds, and entries that are
not zsched messages. The end-to-end proof with the default lease is the
worker crash loop (``tests/e2e/test_recovery_worker.py``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from celery import Celery

from celery_zsched.beat.publish import publish_batch
from celery_zsched.beat.unacked import UnackedSweep, occurrence_in
from celery_zsched.core.job import Job
from celery_zsched.store import Store


@pytest.fixture
def broker_app(redis_url: str) -> Iterator[Celery]:
    """A Celery app whose broker is database 7 of the throwaway server (flushed)."""
    app = Celery("unacked", broker=redis_url.rsplit("/", 1)[0] + "/7", set_as_current=False)
    app.conf.task_default_queue = "sweep"
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushdb()
    app.close()


#: A consumer that takes every message of the queue, acknowledges none, and is killed
#: (a clean close would give them back): what a worker killed before its heartbeat leaves.
_VANISH = """
import os, signal, sys
from kombu import Connection, Queue
conn = Connection(sys.argv[1])
queue = Queue("sweep", channel=conn.channel())
while queue.get(no_ack=False) is not None:
    pass
os.kill(os.getpid(), signal.SIGKILL)
"""


def _take_and_vanish(app: Celery) -> None:
    done = subprocess.run([sys.executable, "-c", _VANISH, app.conf.broker_url], timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGKILL


def test_the_sweep_brings_back_what_a_vanished_consumer_took_a_lease_ago(
        broker_app: Celery, make_store: Callable[..., Store]) -> None:
    store = make_store(lease_s=0.3)
    jobs = [Job.from_dict({"id": f"j{i}", "task": "t", "interval_s": 60, "jitter_s": 0})
            for i in range(3)]
    store.upsert_many(jobs, stagger=False)
    claimed = store.claim().jobs
    with broker_app.producer_or_acquire() as producer:
        publish_batch(broker_app, producer, claimed)
    store.routed([(c, "sweep") for c in claimed])
    held = claimed[2]
    store.beat([], [(held.job.id, held.occurrence, 1, 1, "t")], "alive@host:1")
    _take_and_vanish(broker_app)
    sweep = UnackedSweep(broker_app, store)
    try:
        assert sweep.sweep() == 0  # younger than a lease: its worker may record it yet
        time.sleep(0.35)
        store.beat([], [(held.job.id, held.occurrence, 1, 1, "t")], "alive@host:1")
        assert sweep.sweep() == 2
        assert {c.job.id for c in store.claim().jobs} == {"j0", "j1"}
        assert store.get("j2").status == "queued"  # held by a live worker: left alone
        assert sweep.sweep() == 0  # the cursor moved past them
    finally:
        sweep.close()


def test_the_sweep_switches_itself_off_on_a_broker_that_keeps_no_unacked_index(
        make_store: Callable[..., Store]) -> None:
    app = Celery("amqp", broker="amqp://guest@rabbit.invalid//", set_as_current=False)
    sweep = UnackedSweep(app, make_store())
    assert sweep.sweep() == 0
    assert not sweep.enabled and not sweep.due()


@pytest.mark.parametrize("raw", [None, b"", b"{}", b"[]", b"[1]", b'[{"headers": null}]',
                                 b'[{"headers": {"zsched_job_id": 1}}]',
                                 b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": 1.5,'
                                 b' "zsched_attempt": 1}}]',
                                 b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": true,'
                                 b' "zsched_attempt": 1}}]'])
def test_an_entry_that_is_not_a_zsched_message_is_ignored(raw: bytes | None) -> None:
    assert occurrence_in(raw) is None


def test_a_zsched_entry_names_its_occurrence_and_publish() -> None:
    raw = (b'[{"headers": {"zsched_job_id": "a", "zsched_occurrence": 5, "zsched_attempt": 2,'
           b' "zsched_delivery": 3}}, "", "q"]')
    assert occurrence_in(raw) == ("a", 5, 2, 3)
