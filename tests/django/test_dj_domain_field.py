"""The explicit pacing key (``domain``) in the Django model, its migration, the admin,
import/export and ``zsched_sync``: the row is the durable definition, Redis a copy."""

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

from celery_zsched.contrib.django.forms import ZSchedJobForm
from celery_zsched.contrib.django.models import JobValidationError, ZSchedJob
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.django.test_admin import ADD, CHANGE, form_data
from tests.django.test_dj_commands import _definitions, _rows, _run, _write

pytestmark = pytest.mark.django_db

BAD_DOMAINS = ["bad domain!", "a..b", "-x.com", "exa_mple.com"]


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run on-commit callbacks (the Redis pushes) of what happens inside the block."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


# ------------------------------------------------------------------ model
def test_the_migration_adds_the_column_and_old_rows_have_no_domain() -> None:
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(
            cursor, ZSchedJob._meta.db_table)}
    assert "domain" in columns
    field = ZSchedJob._meta.get_field("domain")
    assert (field.max_length, field.blank) == (253, True)
    row = ZSchedJob.objects.create(job_id="old", task="t", interval_s=60)
    assert row.domain == ""
    assert row.to_job().domain is None


def test_domain_round_trips_between_row_and_job() -> None:
    job = Job.from_dict({"id": "d", "url": "https://cdn.example.org/x", "interval_s": 60,
                         "domain": "Bücher.Example.", "timezone": "UTC"})
    assert job.domain == "xn--bcher-kva.example"
    row = ZSchedJob.from_job(job)
    assert row.domain == "xn--bcher-kva.example"
    row.save()
    row.refresh_from_db()
    assert row.domain == "xn--bcher-kva.example"
    assert row.to_job() == job

    plain = Job.from_dict({"id": "p", "task": "t", "interval_s": 60, "timezone": "UTC"})
    row = ZSchedJob.from_job(plain)
    assert row.domain == ""
    assert row.to_job() == plain


def test_full_clean_stores_the_canonical_domain() -> None:
    row = ZSchedJob(job_id="c", task="t", interval_s=60, domain=" Example.COM. ")
    row.full_clean()
    assert row.domain == "example.com"


@pytest.mark.parametrize("bad", BAD_DOMAINS)
def test_full_clean_rejects_a_bad_domain_on_its_field(bad: str) -> None:
    row = ZSchedJob(job_id="bad", task="t", interval_s=60, domain=bad)
    with pytest.raises(JobValidationError) as err:
        row.full_clean()
    assert list(err.value.message_dict) == ["domain"]
    assert err.value.field == "domain"
    assert row.domain == bad, "a rejected value is left as given"


def test_full_clean_rejects_an_overlong_domain_on_its_field() -> None:
    row = ZSchedJob(job_id="long", task="t", interval_s=60, domain="a." * 130 + "com")
    with pytest.raises(JobValidationError) as err:
        row.full_clean()
    assert list(err.value.message_dict) == ["domain"]


def test_the_form_rejects_a_bad_domain_inline() -> None:
    form = ZSchedJobForm(data=form_data(job_id="f", task="t", interval_s="60",
                                        domain="bad domain!"))
    assert not form.is_valid()
    assert list(form.errors) == ["domain"]
    assert "not a valid host name" in form.errors["domain"][0]


# ------------------------------------------------------------------ admin
def test_admin_shows_the_field_and_rejects_a_bad_domain_inline(admin_client: Client) -> None:
    page = admin_client.get(reverse(ADD)).content.decode()
    assert 'name="domain"' in page
    assert "per-domain politeness" in page
    response = admin_client.post(reverse(ADD), form_data(
        job_id="x", task="t", interval_s="60", domain="-x.com"))
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["domain"]
    assert "hyphen" in form.errors["domain"][0]
    assert not ZSchedJob.objects.exists()


def test_admin_save_puts_the_domain_in_redis(
    admin_client: Client, zstore: Store, capture: Callable[[], Any],
) -> None:
    with capture():
        response = admin_client.post(reverse(ADD), form_data(
            url="https://a.example.org/feed", interval_s="60", domain="Shared.Example"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = ZSchedJob.objects.get()
    assert row.domain == "shared.example"
    assert zstore.get(row.job_id).job.domain == "shared.example"

    # A change reaches Redis; clearing the field takes the domain out again.
    with capture():
        response = admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            url="https://a.example.org/feed", job_id=row.job_id, interval_s="60",
            domain="other.example"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert zstore.get(row.job_id).job.domain == "other.example"
    with capture():
        response = admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            url="https://a.example.org/feed", job_id=row.job_id, interval_s="60"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row.refresh_from_db()
    assert row.domain == ""
    assert zstore.get(row.job_id).job.domain is None


def test_a_saved_rows_redis_copy_has_the_domain(
    zstore: Store, make_row: Callable[..., ZSchedJob], capture: Callable[[], Any],
) -> None:
    with capture():
        row = make_row(1, domain="pace.example")
    assert zstore.get(row.job_id).job.domain == "pace.example"


# ------------------------------------------------------- import / export / sync
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("suffix", [".json", ".csv", ".jsonl"])
def test_import_then_export_round_trips_the_domain(
        tmp_path: Path, zstore: Store, suffix: str) -> None:
    rows = [*_rows(2, domain="Shared.Example"), *_rows(1, start=2),
            {"id": "ip", "task": "t", "interval_s": 30, "domain": "[::1]"}]
    _run("zsched_import", "--file", str(_write(tmp_path / f"in{suffix}", rows)))
    before = _definitions()
    assert sorted(str(job.domain) for job in before.values()) == [
        "::1", "None", "shared.example", "shared.example"]
    for job_id, job in before.items():
        assert ZSchedJob.objects.get(job_id=job_id).domain == (job.domain or "")
        assert zstore.get(job_id).job.domain == job.domain

    exported = tmp_path / f"out{suffix}"
    _run("zsched_export", "--file", str(exported))
    assert "shared.example" in exported.read_text()
    ZSchedJob.objects.all().delete()
    _run("zsched_import", "--file", str(exported))
    assert _definitions() == before

    again = tmp_path / f"again{suffix}"
    _run("zsched_export", "--file", str(again))
    assert again.read_text() == exported.read_text()


@pytest.mark.django_db(transaction=True)
def test_import_rejects_a_bad_domain_naming_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.json", [*_rows(1), *_rows(1, start=1, domain="a..b")])
    with pytest.raises(CommandError, match="domain") as err:
        _run("zsched_import", "--file", str(path))
    assert "Empty Label" in str(err.value)
    assert not ZSchedJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_import_update_changes_the_domain_in_the_row_and_redis(
        tmp_path: Path, zstore: Store) -> None:
    _run("zsched_import", "--file", str(_write(tmp_path / "a.json", _rows(2))))
    out, _err = _run("zsched_import", "--update", "--file",
                     str(_write(tmp_path / "b.json", _rows(2, domain="new.example"))))
    assert "update: 2" in out
    assert set(ZSchedJob.objects.values_list("domain", flat=True)) == {"new.example"}
    assert {zstore.get(j).job.domain for j in _definitions()} == {"new.example"}


@pytest.mark.django_db(transaction=True)
def test_zsched_sync_rebuilds_the_domain_into_redis(
        tmp_path: Path, zstore: Store, rclient: redis.Redis) -> None:
    _run("zsched_import", "--file",
         str(_write(tmp_path / "a.json", [*_rows(2, domain="sync.example"), *_rows(1, start=2)])))
    rclient.flushall()
    out, _err = _run("zsched_sync")
    assert "add to Redis (staggered): 3" in out
    domains = {job_id: zstore.get(job_id).job.domain for job_id in _definitions()}
    assert sorted(str(d) for d in domains.values()) == ["None", "sync.example", "sync.example"]

    # An update() sends no signal: zsched_sync carries the new domain to Redis.
    ZSchedJob.objects.update(domain="moved.example")
    out, _err = _run("zsched_sync")
    assert {zstore.get(job_id).job.domain for job_id in domains} == {"moved.example"}
