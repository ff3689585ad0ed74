"""The cron day rule (``day_rule``) in the Django model, its migration and the admin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django.models import DayRule, ZSchedJob
from celery_zsched.core.job import Job
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.store import Store
from tests.django.test_admin import ADD, CHANGE, form_data

pytestmark = pytest.mark.django_db

FIRST_MONDAY = "0 12 1-7 * mon"


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run on-commit callbacks (the Redis pushes) of what happens inside the block."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_the_migration_adds_the_column_with_or_as_the_default() -> None:
    """Migration 0002 made the column; rows that predate it read as crontab(5)'s "or"."""
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(
            cursor, ZSchedJob._meta.db_table)}
    assert "day_rule" in columns
    row = ZSchedJob.objects.create(job_id="old", task="t", cron=FIRST_MONDAY)
    assert row.day_rule == DayRule.OR == "or"
    assert row.to_job().day_rule == "or"


def test_day_rule_round_trips_between_row_and_job() -> None:
    job = Job.from_dict({"id": "fm", "task": "t", "cron": FIRST_MONDAY, "day_rule": "and",
                         "timezone": "UTC"})
    row = ZSchedJob.from_job(job)
    row.save()
    row.refresh_from_db()
    assert row.day_rule == "and"
    assert row.to_job() == job


def test_full_clean_rejects_an_unknown_day_rule_on_its_field() -> None:
    row = ZSchedJob(job_id="bad", task="t", cron=FIRST_MONDAY, day_rule="xor")
    with pytest.raises(DjangoValidationError) as err:
        row.full_clean()
    assert "day_rule" in err.value.message_dict


def test_admin_add_with_the_and_rule_reaches_redis(
    admin_client: Client, zstore: Store, capture: Callable[[], Any],
) -> None:
    """The admin's radio buttons set the rule; Redis gets it; the words say both must match."""
    page = admin_client.get(reverse(ADD)).content.decode()
    assert 'name="day_rule" value="or"' in page and 'name="day_rule" value="and"' in page
    with capture():
        response = admin_client.post(reverse(ADD), form_data(
            job_id="first-monday", task="t", cron=FIRST_MONDAY, timezone="UTC",
            day_rule="and", jitter_s="0"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = ZSchedJob.objects.get()
    assert row.day_rule == "and"
    info = zstore.get("first-monday")
    assert info.job.day_rule == "and"
    assert info.due_ms is not None
    due = ms_to_dt(info.due_ms)
    assert (due.weekday(), due.day <= 7, due.hour) == (0, True, 12)
    html = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    assert "only on days matching both day fields" in html


def test_admin_rejects_an_unknown_day_rule(admin_client: Client) -> None:
    response = admin_client.post(reverse(ADD), form_data(
        job_id="x", task="t", cron=FIRST_MONDAY, day_rule="xor"))
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["day_rule"]
    assert not ZSchedJob.objects.exists()
