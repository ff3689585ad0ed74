"""Saves and deletes reach Redis after commit, and only then; Redis down never fails a save."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.core.errors import ValidationError
from celery_zsched.store import Store


@pytest.mark.django_db
def test_save_reaches_redis_only_when_the_callbacks_of_the_commit_run(
        zstore: Store, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        row = ZSchedJob(url="http://127.0.0.1:1/a", interval_s=30)
        row.save()
        assert zstore.get_many([row.job_id]) == [None]
    assert len(callbacks) == 1
    assert zstore.get_many([row.job_id]) == [None]
    callbacks[0]()
    info = zstore.get(row.job_id)
    assert info.job == row.to_job() and info.due_ms is not None


@pytest.mark.django_db(transaction=True)
def test_commit_writes_and_rollback_writes_nothing(zstore: Store) -> None:
    with transaction.atomic():
        kept = ZSchedJob.objects.create(url="http://127.0.0.1:1/kept", interval_s=30)
        assert zstore.get_many([kept.job_id]) == [None]
    assert zstore.get(kept.job_id).job.url == "http://127.0.0.1:1/kept"

    with pytest.raises(RuntimeError), transaction.atomic():
        lost = ZSchedJob.objects.create(url="http://127.0.0.1:1/lost", interval_s=30)
        raise RuntimeError("roll back")
    assert zstore.get_many([lost.job_id]) == [None]
    assert not ZSchedJob.objects.filter(job_id=lost.job_id).exists()


@pytest.mark.django_db(transaction=True)
def test_edit_disable_and_delete_follow_the_row(zstore: Store) -> None:
    row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
    row.interval_s = 90
    row.save()
    assert zstore.get(row.job_id).job.interval_s == 90

    row.enabled = False
    row.save()
    info = zstore.get(row.job_id)
    assert info.paused and info.due_ms is None

    row.enabled = True
    row.save()
    assert zstore.get(row.job_id).due_ms is not None

    row.delete()
    assert zstore.get_many([row.job_id]) == [None]


@pytest.mark.django_db(transaction=True)
def test_renaming_a_job_id_removes_the_old_id_from_redis(zstore: Store) -> None:
    row = ZSchedJob.objects.create(job_id="old", task="t", interval_s=30)
    row = ZSchedJob.objects.get(pk=row.pk)
    row.job_id = "new"
    row.save()
    assert zstore.get_many(["old", "new"])[0] is None
    assert zstore.get("new").job.task == "t"


@pytest.mark.django_db(transaction=True)
def test_queryset_delete_reaches_redis(zstore: Store,
                                       make_row: Callable[..., ZSchedJob]) -> None:
    ids = [make_row(n).job_id for n in range(3)]
    ZSchedJob.objects.filter(job_id__in=ids[:2]).delete()
    assert [info is None for info in zstore.get_many(ids)] == [True, True, False]


@pytest.mark.django_db(transaction=True)
def test_save_succeeds_when_redis_is_down_and_the_change_waits_in_the_outbox(
        settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"
    conf.reset()
    with caplog.at_level(logging.WARNING, logger="celery_zsched.django"):
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
        row.delete()
    assert "kept in the outbox" in caplog.text
    assert not ZSchedJob.objects.exists()
    assert list(ZSchedOutbox.objects.order_by("id").values_list("job_id", "action")) == [
        (row.job_id, "save"), (row.job_id, "delete")]


@pytest.mark.django_db(transaction=True)
def test_invalid_row_saved_without_validation_is_logged_not_sent(
        zstore: Store, caplog: pytest.LogCaptureFixture) -> None:
    # save() validates: an invalid definition is never written ...
    with pytest.raises(ValidationError):
        ZSchedJob.objects.create(job_id="bad", task="t", cron="not cron")
    assert not ZSchedJob.objects.exists()
    # ... but update() bypasses save(), and a later save of the runtime mirror
    # alone does not validate the definition, nor send anything.
    row = ZSchedJob.objects.create(job_id="bad", task="t", cron="0 9 * * *")
    ZSchedJob.objects.filter(pk=row.pk).update(cron="not cron")
    row.refresh_from_db()
    with caplog.at_level(logging.ERROR, logger="celery_zsched.django"):
        row.last_status = "complete"
        row.save(update_fields=["last_status"])
    assert caplog.text == "" and not ZSchedOutbox.objects.exists()
    # A raw save (what loaddata does, bypassing save()) of the invalid definition:
    # logged, not sent, and kept in the outbox (whose sweeper counts its attempts).
    with caplog.at_level(logging.ERROR, logger="celery_zsched.django"), transaction.atomic():
        ZSchedJob.save_base(row, raw=True)
    assert "is invalid" in caplog.text
    [info] = zstore.get_many(["bad"])
    assert info is not None and info.job.cron == "0 9 * * *"  # Redis kept the last good one
    assert list(ZSchedOutbox.objects.values_list("job_id", "action")) == [("bad", "save")]
