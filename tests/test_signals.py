"""The failure signals fire once, with the right payload, where the real paths raise them:
the worker's settle hook, beat's reap, and settle.lua opening a domain's breaker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.services import signals
from celery_zsched.services.appstore import store_for_app
from celery_zsched.services.signals import BreakerEvent, JobEvent
from tests.notify_helpers import MakeApp, Recorder, claim_one, fail_in_worker, url_job

pytest_plugins = ["tests.notify_fixtures"]

Rec = Callable[[Celery], Recorder]


def test_an_error_with_retries_left_signals_job_failed_only(notify_app: MakeApp,
                                                            signal_recorder: Rec) -> None:
    app = notify_app(retry_max=2)
    rec = signal_recorder(app)
    claimed = claim_one(store_for_app(app), url_job())
    fail_in_worker(app, claimed)
    assert rec.names() == ["job_failed"]
    event = rec.seen[0][1]
    assert isinstance(event, JobEvent)
    assert (event.job_id, event.name, event.url, event.queue, event.task) == (
        claimed.job.id, "page 0", "http://a.example/p/0", "scrapes", "scrape")
    assert (event.error, event.attempt, event.consecutive_failures) == ("ValueError: boom", 1, 1)
    assert event.occurrence == claimed.occurrence
    assert abs(event.at_ms - store_for_app(app).now_ms()) < 5000


def test_an_error_whose_retries_are_spent_signals_retries_exhausted_once(
        notify_app: MakeApp, signal_recorder: Rec) -> None:
    app = notify_app(retry_max=1, retry_base_s=0.01)
    rec = signal_recorder(app)
    store = store_for_app(app)
    first = claim_one(store, url_job())
    fail_in_worker(app, first)
    time.sleep(0.05)  # the retry is due 10 ms after the error
    (retry,) = store.claim().jobs
    assert retry.attempt == 2
    fail_in_worker(app, retry, RuntimeError("still down"))
    assert rec.names() == ["job_failed", "job_failed", "job_retries_exhausted"]
    exhausted = rec.seen[2][1]
    assert isinstance(exhausted, JobEvent)
    assert (exhausted.attempt, exhausted.consecutive_failures, exhausted.error) == (
        2, 2, "RuntimeError: still down")
    # A duplicate settle of the same attempt changes nothing and signals nothing.
    fail_in_worker(app, retry, ValueError("again"), start=False)
    assert len(rec.seen) == 3


def test_a_failing_streak_fires_once_when_it_reaches_the_setting_and_again_after_a_success(
        notify_app: MakeApp, signal_recorder: Rec) -> None:
    app = notify_app(retry_max=0, notify_streak=3)
    rec = signal_recorder(app)
    store = store_for_app(app)
    job = url_job()
    for _ in range(5):
        fail_in_worker(app, claim_one(store, job))
    streaks = [e for name, e in rec.seen if name == "job_failing_streak"]
    assert len(streaks) == 1 and isinstance(streaks[0], JobEvent)
    assert streaks[0].consecutive_failures == 3
    ok = claim_one(store, job)
    assert store.start(ok.job.id, ok.occurrence, ok.attempt).runs
    assert store.settle(ok.job.id, ok.occurrence, ok.attempt, "complete").applied
    for _ in range(3):
        fail_in_worker(app, claim_one(store, job))
    assert rec.names().count("job_failing_streak") == 2


def test_a_streak_setting_of_zero_never_signals_a_streak(notify_app: MakeApp,
                                                         signal_recorder: Rec) -> None:
    app = notify_app(retry_max=0, notify_streak=0)
    rec = signal_recorder(app)
    for _ in range(3):
        fail_in_worker(app, claim_one(store_for_app(app), url_job()))
    assert "job_failing_streak" not in rec.names()


def test_beats_reap_signals_each_dead_letter_once(notify_app: MakeApp,
                                                  signal_recorder: Rec) -> None:
    app = notify_app(lease_s=0.05, max_deliveries=1)
    rec = signal_recorder(app)
    scheduler = ZSchedScheduler(app=app)
    try:
        store = scheduler.store
        job = url_job(7)
        store.upsert(job)
        store.run_now(job.id)
        scheduler.tick()  # claims and publishes it (the broker is the throwaway Redis)
        state = store.get(job.id).state
        assert store.start(job.id, state.occurrence, state.attempt).runs
        time.sleep(0.1)  # the execution lease runs out: the worker "died"
        scheduler.tick()
        scheduler.tick()
    finally:
        scheduler.close()
    assert rec.names() == ["job_dead_lettered"]
    event = rec.seen[0][1]
    assert isinstance(event, JobEvent)
    assert (event.job_id, event.name, event.url, event.queue) == (
        job.id, "page 7", "http://a.example/p/7", "scrapes")
    assert "1 crashed executions" in event.error
    assert store_for_app(app).get(job.id).status == "dead"


def test_the_breaker_opening_is_signalled_once_per_opening(notify_app: MakeApp,
                                                           signal_recorder: Rec) -> None:
    app = notify_app(pacing=True, domain_delay_s=0, domain_max_in_flight=0,
                   domain_start_margin_s=0, breaker_min_requests=2, breaker_ratio=0.5,
                   breaker_cooldown_s=0.2, retry_max=0)
    rec = signal_recorder(app)
    store = store_for_app(app)
    jobs = [url_job(i, host="down.example") for i in range(2)]
    claimed = [claim_one(store, job) for job in jobs]
    fail_in_worker(app, claimed[0])
    assert "domain_breaker_opened" not in rec.names()
    fail_in_worker(app, claimed[1])
    opened = [e for name, e in rec.seen if name == "domain_breaker_opened"]
    assert len(opened) == 1 and isinstance(opened[0], BreakerEvent)
    assert (opened[0].domain, opened[0].job_id, opened[0].error) == (
        "down.example", jobs[1].id, "ValueError: boom")
    assert store.domain("down.example").breaker == "open"
    # The probe after the cool-down fails: the breaker stays open, no new opening.
    time.sleep(0.25)
    store.run_now(jobs[0].id)
    (probe,) = store.claim().jobs
    fail_in_worker(app, probe)
    assert store.domain("down.example").breaker == "open"
    assert rec.names().count("domain_breaker_opened") == 1


def test_a_receiver_that_raises_breaks_neither_the_settle_nor_other_receivers(
        notify_app: MakeApp, signal_recorder: Rec) -> None:
    app = notify_app(retry_max=0)

    def broken(**_: Any) -> None:
        raise RuntimeError("receiver bug")
    signals.job_failed.connect(broken, sender=app, weak=False, dispatch_uid="broken")
    try:
        rec = signal_recorder(app)
        store = store_for_app(app)
        claimed = claim_one(store, url_job())
        fail_in_worker(app, claimed)
    finally:
        signals.job_failed.disconnect(broken, sender=app, dispatch_uid="broken")
    assert rec.names() == ["job_failed", "job_retries_exhausted"]
    assert store.get(claimed.job.id).state.last_outcome == "error"


def test_signals_of_one_app_do_not_reach_receivers_of_another(notify_app: MakeApp,
                                                             signal_recorder: Rec) -> None:
    app, other = notify_app(retry_max=0), notify_app()
    rec_other = signal_recorder(other)
    fail_in_worker(app, claim_one(store_for_app(app), url_job()))
    assert rec_other.seen == []
