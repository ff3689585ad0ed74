"""The mail_admins notifier, switched on by Django settings (locmem mail backend)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.core import mail

from celery_zsched import notify
from celery_zsched.services import signals
from celery_zsched.services.appstore import forget_app, store_for_app
from celery_zsched.worker import heartbeat
from tests.notify_helpers import claim_one, fail_in_worker, started_then_lost, url_job, wait_until


@pytest.fixture
def django_app(settings: Any) -> Iterator[Celery]:
    """A Celery app configured from Django settings (``CELERY_*``), mailing ADMINS."""
    settings.ADMINS = [("Ops", "ops@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CELERY_ZSCHED_NOTIFY_MAIL = True
    settings.CELERY_ZSCHED_RETRY_MAX = 0
    app = Celery("dj-notify", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    yield app
    notify.uninstall(app)
    heartbeat._beats.pop(id(app), None)
    forget_app(app)


def _mails(count: int, timeout: float = 15.0) -> list[Any]:
    wait_until(lambda: len(mail.outbox) >= count, timeout, f"{count} mails")
    return list(mail.outbox)


def test_a_failure_mails_the_admins_once_per_job_and_window(
        django_app: Celery, mailoutbox: list[Any]) -> None:
    notifier = notify.install(django_app)
    assert notifier is not None and [t.name for t in notifier.transports] == ["mail"]
    store = store_for_app(django_app)
    job = url_job(4)
    fail_in_worker(django_app, claim_one(store, job))
    fail_in_worker(django_app, claim_one(store, job))
    wait_until(lambda: notifier.stats.limited == 1, what="the second notice limited")
    (sent,) = _mails(1)
    assert sent.to == ["ops@example.com"]
    assert sent.subject.endswith("job_retries_exhausted: page 4")
    assert f"job_id: {job.id}" in sent.body and "error: ValueError: boom" in sent.body
    time.sleep(0.2)
    assert len(mail.outbox) == 1


def test_a_thousand_dead_letters_send_one_digest_mail_not_a_thousand(
        django_app: Celery, settings: Any, mailoutbox: list[Any]) -> None:
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    settings.CELERY_ZSCHED_NOTIFY_DIGEST_THRESHOLD = 20
    # All 1,000 pass notify.lua within the window, even loaded.
    settings.CELERY_ZSCHED_NOTIFY_DIGEST_WINDOW_S = 5
    assert notify.install(django_app) is not None
    store = store_for_app(django_app)
    signals.after_reap(django_app, store, started_then_lost(store, 1000))  # as beat does
    mails = _mails(21)
    time.sleep(0.3)
    assert len(mail.outbox) == 21
    digests = [m for m in mails if "more notices" in m.subject]
    assert len(digests) == 1
    assert digests[0].subject.endswith("[zsched] 980 more notices in 5 s (980 job_dead_lettered)")
    assert "... and 960 more" in digests[0].body
    assert sum("job_dead_lettered: " in m.subject for m in mails) == 20


def test_system_checks_name_a_bad_notify_setting_and_mail_without_admins(
        settings: Any) -> None:
    settings.CELERY_ZSCHED_NOTIFY_MAIL = True
    settings.ADMINS = []
    assert [m.id for m in run_checks()] == ["zsched.W002"]
    settings.ADMINS = [("Ops", "ops@example.com")]
    assert run_checks() == []
    settings.CELERY_ZSCHED_NOTIFY_WEBHOOK_URL = "hooks.example.com"
    (error,) = run_checks()
    assert error.id == "zsched.E001" and "zsched_notify_webhook_url" in error.msg


def run_checks() -> list[Any]:
    """The zsched system checks' messages."""
    from celery_zsched.contrib.django.checks import check_notify_mail, check_settings

    return [*check_settings(), *check_notify_mail()]
