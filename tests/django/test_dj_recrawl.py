"""The recrawl fields (issue 22) in the Django model, its migration, the admin and the
management commands: an adaptive job saved in the admin reaches Redis as one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django.models import JobValidationError, ZSchedJob
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.django.test_admin import ADD, form_data
from tests.django.test_dj_commands import _definitions, _rows, _run, _write

pytestmark = pytest.mark.django_db
FIELDS = ("recrawl", "min_interval_s", "max_interval_s", "freshness_target")


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_the_migration_adds_the_columns_and_old_rows_are_fixed() -> None:
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(
            cursor, ZSchedJob._meta.db_table)}
    assert set(FIELDS) <= columns
    row = ZSchedJob.objects.create(job_id="old", task="t", interval_s=60)
    assert row.recrawl == "fixed" and row.to_job().recrawl == "fixed"


def test_an_adaptive_job_round_trips_between_row_and_job() -> None:
    job = Job.from_dict({"id": "a", "url": "https://example.org/x", "interval_s": 600,
                         "recrawl": "adaptive", "min_interval_s": 60, "max_interval_s": 6000,
                         "freshness_target": 0.9, "timezone": "UTC"})
    row = ZSchedJob.from_job(job)
    row.save()
    row.refresh_from_db()
    assert row.to_job() == job


def test_full_clean_refuses_an_adaptive_cron_job_on_its_field() -> None:
    row = ZSchedJob(job_id="bad", task="t", cron="* * * * *", recrawl="adaptive")
    with pytest.raises(JobValidationError) as err:
        row.full_clean()
    assert "recrawl" in err.value.message_dict
    assert "adaptive needs an interval job" in str(err.value.message_dict["recrawl"])


def test_the_admin_saves_an_adaptive_job_to_redis_and_shows_a_bad_bound_inline(
        admin_client: Client, zstore: Store, capture: Callable[[], Any]) -> None:
    page = admin_client.get(reverse(ADD)).content.decode()
    assert all(f'name="{name}"' in page for name in FIELDS)
    with capture():
        response = admin_client.post(reverse(ADD), form_data(
            url="https://a.example.org/feed", interval_s="600", recrawl="adaptive",
            min_interval_s="60", max_interval_s="6000", freshness_target="0.9"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = zstore.get(ZSchedJob.objects.get().job_id).job
    assert (job.recrawl, job.min_interval_s, job.max_interval_s, job.freshness_target) == (
        "adaptive", 60, 6000, 0.9)
    response = admin_client.post(reverse(ADD), form_data(
        url="https://b.example.org/feed", interval_s="600", recrawl="adaptive",
        min_interval_s="600", max_interval_s="60"))
    assert response.status_code == 200
    assert "max_interval_s" in response.context["adminform"].form.errors
    assert ZSchedJob.objects.count() == 1


@pytest.mark.parametrize("suffix", [".json", ".csv", ".jsonl"])
def test_import_and_export_commands_carry_adaptive_jobs(tmp_path: Path, suffix: str,
                                                        zstore: Store) -> None:
    rows = _rows(3, recrawl="adaptive", min_interval_s=6, max_interval_s=600,
                 freshness_target=0.75)
    _run("zsched_import", "--file", str(_write(tmp_path / f"in{suffix}", rows)))
    before = _definitions()
    assert {job.recrawl for job in before.values()} == {"adaptive"}
    out = tmp_path / f"out{suffix}"
    _run("zsched_export", "--file", str(out))
    ZSchedJob.objects.all().delete()
    _run("zsched_import", "--file", str(out))
    assert _definitions() == before


def _taught(zstore: Store, job_id: str) -> None:
    """Three visits of ``job_id``: one change seen."""
    from celery_zsched.core.recrawl import Visit

    for changed in (False, True, False):
        zstore.run_now(job_id)
        claimed = next(c for c in zstore.claim().jobs if c.job.id == job_id)
        zstore.settle(job_id, claimed.occurrence, claimed.attempt, "complete",
                      visit=Visit(changed=changed))


def test_the_job_page_and_the_dashboard_show_what_the_visits_taught(
        admin_client: Client, zstore: Store, capture: Callable[[], Any]) -> None:
    from tests.django.test_admin import CHANGE

    with capture():
        row = ZSchedJob.objects.create(job_id="page", url="https://a.example.org/p",
                                       interval_s=600, recrawl="adaptive")
    _taught(zstore, "page")
    page = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    assert "what its visits taught" in page.lower()
    assert "changes about" in page and "last change seen" in page
    dashboard = admin_client.get(reverse("admin:zsched_dashboard")).content.decode()
    assert 'id="zsched-freshness"' in dashboard and "Recrawl intervals (sampled)" in dashboard
    assert "With a change-rate estimate</th><td class=\"num\">1<" in dashboard
