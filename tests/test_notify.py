"""The webhook notifier against a local HTTP receiver that checks its HMAC, and the
rate limit and digest that Redis keeps for every process."""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import pytest
from celery import Celery

from celery_zsched import notify
from celery_zsched.config import Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.notify import DeliveryFailed, Message, Notifier, Webhook
from celery_zsched.services import signals
from celery_zsched.services.appstore import store_for_app
from celery_zsched.store import Store
from tests.docs_pages import page
from tests.notify_helpers import (
    MakeApp,
    claim_one,
    fail_in_worker,
    job_event,
    started_then_lost,
    url_job,
    wait_until,
)
from tests.webhook_receiver import Receiver, verify

pytest_plugins = ["tests.notify_fixtures"]


def _webhook_app(notify_app: MakeApp, receiver: Receiver, **conf: Any) -> Celery:
    app = notify_app(**{"notify_webhook_url": receiver.url, "notify_webhook_secret": "s3cret",
                        "notify_webhook_timeout_s": 2, **conf})
    assert notify.install(app) is not None
    return app


def _notifier(app: Celery) -> Notifier:
    notifier = notify.install(app)
    assert notifier is not None
    return notifier


# ----------------------------------------------------------------- delivery
def test_a_notice_is_posted_as_json_signed_with_hmac_over_timestamp_and_body(
        notify_app: MakeApp, webhook_receiver: Receiver) -> None:
    app = _webhook_app(notify_app, webhook_receiver, retry_max=0)
    claimed = claim_one(store_for_app(app), url_job(3))
    fail_in_worker(app, claimed)
    (post,) = webhook_receiver.wait(1)
    assert post.verified and post.status == 200
    assert post.event == "job_retries_exhausted"
    assert post.headers["Content-Type"] == "application/json"
    body = post.body
    assert (body["event"], body["job_id"], body["name"], body["url"], body["queue"]) == (
        "job_retries_exhausted", claimed.job.id, "page 3", "http://a.example/p/3", "scrapes")
    assert (body["error"], body["attempt"], body["consecutive_failures"]) == (
        "ValueError: boom", 1, 1)
    # The signature covers the body and the timestamp: change either and it fails.
    raw = Message("x", body).to_json()
    assert not verify("s3cret", post.headers, raw + b" ")
    assert not verify("s3cret", {**post.headers, "X-Zsched-Timestamp": "1"}, raw)
    assert not verify("other", post.headers, raw)


def test_only_the_signals_named_in_notify_events_are_sent(
        notify_app: MakeApp, webhook_receiver: Receiver) -> None:
    app = _webhook_app(notify_app, webhook_receiver, retry_max=2, notify_events="job_failed")
    fail_in_worker(app, claim_one(store_for_app(app), url_job()))
    (post,) = webhook_receiver.wait(1)
    assert post.event == "job_failed"
    time.sleep(0.2)
    assert len(webhook_receiver.posts) == 1


def test_a_second_failure_of_a_job_inside_the_window_sends_nothing(
        notify_app: MakeApp, webhook_receiver: Receiver) -> None:
    app = _webhook_app(notify_app, webhook_receiver, retry_max=0)
    store = store_for_app(app)
    job = url_job()
    fail_in_worker(app, claim_one(store, job))
    fail_in_worker(app, claim_one(store, job))
    notifier = _notifier(app)
    wait_until(lambda: notifier.stats.limited == 1, what="the second notice limited")
    fail_in_worker(app, claim_one(store, url_job(1)))  # another job is not limited
    webhook_receiver.wait(2)
    time.sleep(0.2)
    assert [p.body["job_id"] for p in webhook_receiver.posts] == [job.id, url_job(1).id]


def test_the_rate_limit_holds_across_processes(store: Store, webhook_receiver: Receiver) -> None:
    """Two notifiers (two processes) on one store: one notice per job and window."""
    settings = Settings(notify_webhook_url=webhook_receiver.url, notify_webhook_secret="s3cret")
    first, second = (Notifier(settings, lambda: store, [Webhook(webhook_receiver.url, "s3cret")])
                     for _ in range(2))
    try:
        first.enqueue(job_event(1))
        second.enqueue(job_event(1))
        wait_until(lambda: first.stats.sent + first.stats.limited
                   + second.stats.sent + second.stats.limited == 2)
    finally:
        first.close()
        second.close()
    assert len(webhook_receiver.posts) == 1
    assert first.stats.limited + second.stats.limited == 1


# ------------------------------------------------------------------- digest
def test_a_thousand_dead_letters_within_a_minute_send_a_digest_not_a_thousand_posts(
        notify_app: MakeApp, webhook_receiver: Receiver) -> None:
    app = _webhook_app(notify_app, webhook_receiver, lease_s=0.05, max_deliveries=1,
                       # All 1,000 pass notify.lua within the window, even loaded.
                       notify_digest_threshold=20, notify_digest_window_s=5)
    store = store_for_app(app)
    dead_ids = started_then_lost(store, 1000)  # 1,000 workers "died"
    began = time.perf_counter()
    signals.after_reap(app, store, dead_ids)  # what beat does after its reap
    signalled_s = time.perf_counter() - began
    posts = webhook_receiver.wait(21, timeout=15)
    time.sleep(0.3)
    assert len(webhook_receiver.posts) == 21, [p.event for p in webhook_receiver.posts]
    assert all(p.verified for p in posts)
    notices, digests = webhook_receiver.of("job_dead_lettered"), webhook_receiver.of("digest")
    assert (len(notices), len(digests)) == (20, 1)
    digest = digests[0].body
    assert digest["count"] == 980 and digest["by_event"] == {"job_dead_lettered": 980}
    assert len(digest["notices"]) == notify.DIGEST_CAP
    assert digest["end_ms"] - digest["start_ms"] == 5000
    sent = {p.body["job_id"] for p in notices} | {n["job_id"] for n in digest["notices"]}
    assert len(sent) == 20 + notify.DIGEST_CAP  # nobody twice
    assert signalled_s < 2.0, signalled_s  # enqueue only: no delivery on beat's path


def test_exactly_one_process_sends_the_digest_of_a_window(
        store: Store, webhook_receiver: Receiver) -> None:
    settings = Settings(notify_webhook_url=webhook_receiver.url, notify_webhook_secret="s3cret",
                        notify_digest_threshold=5, notify_digest_window_s=0.5)
    notifiers = [Notifier(settings, lambda: store, [Webhook(webhook_receiver.url, "s3cret")])
                 for _ in range(3)]
    try:
        def feed(notifier: Notifier, part: int) -> None:
            for n in range(part * 100, part * 100 + 100):
                notifier.enqueue(job_event(n))
        feeders = [threading.Thread(target=feed, args=(n, i)) for i, n in enumerate(notifiers)]
        for t in feeders:
            t.start()
        for t in feeders:
            t.join()
        webhook_receiver.wait(6)
        time.sleep(1.0)  # every notifier's flush is due by now
    finally:
        for notifier in notifiers:
            notifier.close()
    digests = webhook_receiver.of("digest")
    assert len(digests) == 1 and digests[0].body["count"] == 295
    assert len(webhook_receiver.of("job_dead_lettered")) == 5
    assert sum(n.stats.digests for n in notifiers) == 1


def test_a_held_digest_is_claimed_by_the_next_notice_when_no_flush_came(
        store: Store, webhook_receiver: Receiver) -> None:
    """A process that held notices may exit before its window ends: the first notice
    after the window, from any process, claims the digest."""
    settings = Settings(notify_webhook_url=webhook_receiver.url, notify_digest_threshold=1,
                        notify_digest_window_s=0.3)
    gone = Notifier(settings, lambda: store, [])  # no transport: it "exits" before flushing
    for n in range(4):
        gone.enqueue(job_event(n))
    wait_until(lambda: gone.stats.held == 3)
    gone.close()  # the process exits before the window ends: nobody flushes it
    time.sleep(0.35)
    later = Notifier(settings, lambda: store, [Webhook(webhook_receiver.url)])
    try:
        later.enqueue(job_event(99))
        webhook_receiver.wait(2)
    finally:
        later.close()
    assert [p.event for p in webhook_receiver.posts] == ["digest", "job_dead_lettered"]
    assert webhook_receiver.posts[0].body["count"] == 3


# ---------------------------------------------------------------- non-blocking
def test_a_hanging_receiver_does_not_delay_the_worker_hook(
        notify_app: MakeApp, webhook_receiver: Receiver) -> None:
    webhook_receiver.hang_s = 10.0
    app = _webhook_app(notify_app, webhook_receiver, retry_max=0, notify_webhook_retries=0,
                       notify_webhook_timeout_s=0.5, notify_digest_threshold=1)
    quiet = notify_app(retry_max=0)  # the same hook with no notifier: the baseline
    store, quiet_store = store_for_app(app), store_for_app(quiet)
    fail_in_worker(app, claim_one(store, url_job(0)))
    webhook_receiver.wait(1)  # the first POST now hangs in the notifier's thread

    def hook_times(target: Celery, target_store: Store) -> list[float]:
        return [fail_in_worker(target, claim_one(target_store, url_job(n)))
                for n in range(1, 21)]
    with_webhook, baseline = hook_times(app, store), hook_times(quiet, quiet_store)
    extra_ms = (statistics.median(with_webhook) - statistics.median(baseline)) * 1000
    # Waiting on the webhook would cost its 0.5 s timeout (or the 10 s hang) per
    # call; the bounds tell that apart with room for a loaded CI machine (the
    # medians differ by under 1 ms when idle).
    assert extra_ms < 25, (extra_ms, with_webhook, baseline)
    assert max(with_webhook) < 0.4, with_webhook
    assert len(webhook_receiver.posts) == 1  # still hanging: the hooks never waited for it


def test_a_full_queue_drops_and_counts_instead_of_blocking(store: Store) -> None:
    release = threading.Event()

    class Stuck:
        name = "stuck"

        def send(self, message: Message) -> None:
            release.wait(10)
    notifier = Notifier(Settings(notify_queue_size=3, notify_webhook_url="http://127.0.0.1:1/"),
                        lambda: store, [Stuck()])
    try:
        notifier.enqueue(job_event(0))
        wait_until(lambda: notifier._queue.empty())  # the thread is stuck sending it
        took = []
        for n in range(1, 11):
            began = time.perf_counter()
            notifier.enqueue(job_event(n))
            took.append(time.perf_counter() - began)
        assert notifier.stats.dropped == 7 and notifier.stats.queued == 4
        assert max(took) < 0.2, took  # blocking would wait out the stuck 10 s send
    finally:
        release.set()
        assert notifier.close()
    assert notifier.stats.sent == 4


def test_close_delivers_what_is_queued_within_a_bounded_wait(
        store: Store, webhook_receiver: Receiver) -> None:
    settings = Settings(notify_webhook_url=webhook_receiver.url)
    notifier = Notifier(settings, lambda: store, [Webhook(webhook_receiver.url)])
    for n in range(5):
        notifier.enqueue(job_event(n))
    assert notifier.close(timeout=5)
    assert len(webhook_receiver.posts) == 5
    webhook_receiver.hang_s = 10.0
    slow = Notifier(settings, lambda: store, [Webhook(webhook_receiver.url, timeout_s=5)])
    slow.enqueue(job_event(50))
    began = time.monotonic()
    assert not slow.close(timeout=0.3)  # gives up instead of holding the exit
    assert time.monotonic() - began < 1.0


# ------------------------------------------------------------------ retries
def test_the_webhook_retries_a_500_then_succeeds(webhook_receiver: Receiver) -> None:
    webhook_receiver.fail_first = 2
    Webhook(webhook_receiver.url, "s3cret", retries=3, backoff_s=0.05).send(
        Message.notice(job_event(1)))
    assert [p.status for p in webhook_receiver.posts] == [500, 500, 200]
    assert all(p.verified for p in webhook_receiver.posts)  # each attempt signed afresh


def test_the_webhook_gives_up_after_its_retries_and_never_retries_a_400(
        webhook_receiver: Receiver) -> None:
    webhook_receiver.status = 503
    hook = Webhook(webhook_receiver.url, "s3cret", retries=2, backoff_s=0.01)
    with pytest.raises(DeliveryFailed, match="3 attempts"):
        hook.send(Message.notice(job_event(1)))
    assert len(webhook_receiver.posts) == 3
    webhook_receiver.status = 400
    with pytest.raises(DeliveryFailed, match="HTTP 400"):
        hook.send(Message.notice(job_event(2)))
    assert len(webhook_receiver.posts) == 4


def test_a_refused_connection_is_retried_then_given_up_and_counted(store: Store) -> None:
    url = "http://127.0.0.1:1/hook"  # nothing listens on port 1
    notifier = Notifier(Settings(notify_webhook_url=url), lambda: store,
                        [Webhook(url, retries=1, backoff_s=0.01, timeout_s=0.5)])
    notifier.enqueue(job_event(1))
    assert notifier.close()
    assert (notifier.stats.failed, notifier.stats.sent) == (1, 0)


# ----------------------------------------------------------------- settings
@pytest.mark.parametrize(("values", "named"), [
    ({"zsched_notify_webhook_url": "not a url"}, "zsched_notify_webhook_url"),
    ({"zsched_notify_webhook_url": "ftp://example.com/x"}, "zsched_notify_webhook_url"),
    ({"zsched_notify_webhook_secret": "k"}, "zsched_notify_webhook_secret"),
    ({"zsched_notify_events": "job_failed,job_exploded"}, "zsched_notify_events"),
    ({"zsched_notify_window_s": 0}, "zsched_notify_window_s"),
    ({"zsched_notify_digest_window_s": -1}, "zsched_notify_digest_window_s"),
    ({"zsched_notify_digest_threshold": -1}, "zsched_notify_digest_threshold"),
    ({"zsched_notify_streak": "often"}, "zsched_notify_streak"),
    ({"zsched_notify_mail": "maybe"}, "zsched_notify_mail"),
])
def test_a_bad_notify_setting_fails_naming_it(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Settings.from_mapping(values, env={})


def test_notify_events_takes_a_list_or_a_comma_separated_string() -> None:
    listed = Settings.from_mapping({"zsched_notify_events": ["job_failed",
                                                             "domain_breaker_opened"]}, env={})
    assert listed.notify_event_names == ("job_failed", "domain_breaker_opened")
    env = Settings.from_mapping({}, env={"ZSCHED_NOTIFY_EVENTS": "job_failed, job_failing_streak"})
    assert env.notify_event_names == ("job_failed", "job_failing_streak")


def test_a_bad_webhook_url_stops_the_worker_at_start(notify_app: MakeApp) -> None:
    app = notify_app(notify_webhook_url="localhost:8080/hook")
    with pytest.raises(ConfigurationError, match="zsched_notify_webhook_url"):
        notify.install(app)


def test_no_notifier_is_installed_unless_a_setting_switches_one_on(
        notify_app: MakeApp) -> None:
    assert notify.install(notify_app()) is None



def test_the_readme_documents_every_notify_setting_and_signal() -> None:
    reference = page("reference/configuration.md")
    for name in Settings.names():
        if name.startswith("notify_"):
            assert f"| `zsched_{name}` | `ZSCHED_{name.upper()}` |" in reference, name
    notifications = page("how-to/notifications.md")
    for name in signals.SIGNALS:
        assert f"| `{name}` |" in notifications, name


def test_a_forked_child_starts_its_own_sender_thread(store: Store,
                                                     webhook_receiver: Receiver) -> None:
    """A prefork child inherits the notifier but not its thread: it starts its own."""
    notifier = Notifier(Settings(notify_webhook_url=webhook_receiver.url), lambda: store,
                        [Webhook(webhook_receiver.url)])
    try:
        notifier.enqueue(job_event(1))
        wait_until(lambda: notifier.stats.sent == 1)  # the parent's thread is running
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            ok = False
            try:
                ok = (notifier.enqueue(job_event(2)) and notifier.close(5)
                      and notifier.stats.sent == 2)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        notifier.enqueue(job_event(3))  # the parent's own thread still works
        webhook_receiver.wait(3)
    finally:
        notifier.close()
    assert sorted(p.body["job_id"] for p in webhook_receiver.posts) == ["job-1", "job-2", "job-3"]
