"""The ``transport`` field in the Django model, its migration, the admin, import/export
and ``zsched_sync``: an HTTP job's Redis copy waits in the HTTP schedule."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import CommandError
from django.db import connection
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django.models import JobValidationError, ZSchedJob
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.django.test_admin import ADD, CHANGE, form_data
from tests.django.test_dj_commands import _definitions, _rows, _run, _write

pytestmark = pytest.mark.django_db


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run on-commit callbacks (the Redis pushes) of what happens inside the block."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def _in_http_schedule(store: Store, job_id: str) -> bool:
    return store.client.zscore(store.keys.http_schedule, job_id) is not None


def test_the_migration_adds_the_column_and_old_rows_are_celery_jobs() -> None:
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(
            cursor, ZSchedJob._meta.db_table)}
    assert "transport" in columns
    row = ZSchedJob.objects.create(job_id="old", task="t", interval_s=60)
    assert row.transport == "celery" and row.to_job().transport == "celery"


def test_transport_round_trips_between_row_and_job() -> None:
    job = Job.from_dict({"id": "h", "url": "https://example.org/x", "interval_s": 60,
                         "transport": "http", "timezone": "UTC"})
    row = ZSchedJob.from_job(job)
    row.save()
    row.refresh_from_db()
    assert row.transport == "http" and row.to_job() == job


def test_full_clean_rejects_an_unknown_transport_on_its_field() -> None:
    row = ZSchedJob(job_id="bad", task="t", interval_s=60, transport="smoke")
    with pytest.raises(JobValidationError) as err:
        row.full_clean()
    assert "transport" in err.value.message_dict


def test_admin_offers_the_field_and_a_saved_http_job_waits_in_the_http_schedule(
        admin_client: Client, zstore: Store, capture: Callable[[], Any]) -> None:
    page = admin_client.get(reverse(ADD)).content.decode()
    assert 'name="transport"' in page and "GET /jobs/next" in page
    with capture():
        response = admin_client.post(reverse(ADD), form_data(
            url="https://a.example.org/feed", interval_s="60", transport="http"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = ZSchedJob.objects.get()
    assert zstore.get(row.job_id).job.transport == "http"
    assert _in_http_schedule(zstore, row.job_id)
    with capture():
        response = admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            url="https://a.example.org/feed", job_id=row.job_id, interval_s="60",
            transport="celery"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert not _in_http_schedule(zstore, row.job_id)
    assert zstore.client.zscore(zstore.keys.schedule, row.job_id) is not None
    response = admin_client.post(reverse(ADD), form_data(
        url="https://b.example.org/feed", interval_s="60", transport="pigeon"))
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["transport"]


@pytest.mark.django_db(transaction=True)
def test_import_export_and_sync_keep_the_transport(
        tmp_path: Path, zstore: Store, rclient: redis.Redis) -> None:
    _run("zsched_import", "--file",
         str(_write(tmp_path / "a.csv", [*_rows(2, transport="http"), *_rows(1, start=2)])))
    before = _definitions()
    assert sorted(job.transport for job in before.values()) == ["celery", "http", "http"]
    exported = tmp_path / "out.csv"
    _run("zsched_export", "--file", str(exported))
    assert "http" in exported.read_text()
    rclient.flushall()
    out, _err = _run("zsched_sync")
    assert "add to Redis (staggered): 3" in out
    for job_id, job in before.items():
        assert zstore.get(job_id).job.transport == job.transport
        assert _in_http_schedule(zstore, job_id) == (job.transport == "http")


@pytest.mark.django_db(transaction=True)
def test_import_rejects_a_bad_transport_naming_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.json", [*_rows(1), *_rows(1, start=1, transport="ftp")])
    with pytest.raises(CommandError, match="transport"):
        _run("zsched_import", "--file", str(path))
    assert not ZSchedJob.objects.exists()
