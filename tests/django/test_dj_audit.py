"""The audit trail in Django: admin, import and reconcile changes are recorded with
their actor, copied into ``ZSchedJobChange`` idempotently, and shown on the job's
page and in a searchable, filterable, read-only list."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.audit import drain_changes
from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedJobChange
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core import audit
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from celery_zsched.store.repartition import repartition
from tests.dead_letters import kill
from tests.django.test_admin import ADD, CHANGE, action, form_data

pytestmark = pytest.mark.django_db

CHANGES = "admin:zsched_zschedjobchange_changelist"
DEAD = "admin:zsched_dead_letters"


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run the on-commit Redis pushes of the block when it ends."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def saved(make_row: Callable[..., ZSchedJob], capture: Callable[[], Any]
          ) -> Callable[..., ZSchedJob]:
    """Save a row and push it to Redis (its on-commit callback run)."""
    def make(n: int = 0, **fields: Any) -> ZSchedJob:
        with capture():
            return make_row(n, **fields)
    return make


def trail(job_id: str) -> list[ZSchedJobChange]:
    """The job's recorded changes, newest first, after a drain."""
    drain_changes()
    return list(ZSchedJobChange.objects.filter(job_id=job_id).order_by("-at", "-id"))


def actions(job_id: str) -> list[tuple[str, str, str]]:
    return [(c.action, c.actor_kind, c.actor_name) for c in trail(job_id)]


def add_in_admin(client: Client, capture: Callable[[], Any], **fields: str) -> ZSchedJob:
    with capture():
        response = client.post(reverse(ADD), form_data(**fields))
    assert response.status_code == 302, response.context["adminform"].form.errors
    return ZSchedJob.objects.get(url=fields["url"])


def test_admin_create_and_edit_are_recorded_with_the_user_and_an_exact_diff(
        admin_client: Client, admin_user: User, zstore: Store,
        capture: Callable[[], Any]) -> None:
    row = add_in_admin(admin_client, capture, url="https://a.example/feed", name="Feed",
                       interval_s="60")
    page = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    assert 'name="zsched_note"' in page
    with capture():
        response = admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            url="https://a.example/feed", job_id=row.job_id, name="Feed v2",
            interval_s="120", jitter_s="5", zsched_note="slower, the site is small"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    edit, create = trail(row.job_id)
    assert (create.action, create.actor_kind, create.actor_name) == (
        "create", "admin", admin_user.username)
    assert create.diff["url"] == [None, "https://a.example/feed"]
    assert (edit.action, edit.actor_kind, edit.actor_name) == (
        "edit", "admin", admin_user.username)
    assert edit.diff == {"interval_s": [60, 120], "jitter_s": [None, 5],
                         "name": ["Feed", "Feed v2"]}
    assert (edit.note, create.note) == ("slower, the site is small", "")


def test_an_admin_save_that_changes_nothing_records_nothing(
        admin_client: Client, zstore: Store, capture: Callable[[], Any]) -> None:
    row = add_in_admin(admin_client, capture, url="https://a.example/same", interval_s="60")
    with capture():
        admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            url="https://a.example/same", job_id=row.job_id, interval_s="60"))
    assert [c.action for c in trail(row.job_id)] == ["create"]


def test_admin_actions_pause_with_a_note_resume_and_run_now(
        admin_client: Client, admin_user: User, zstore: Store,
        saved: Callable[..., ZSchedJob]) -> None:
    row = saved(1)
    drain_changes()
    ZSchedJobChange.objects.all().delete()  # only the actions below
    response = action(admin_client, "pause_jobs", [row.job_id])
    assert response.status_code == 200
    admin_client.post(reverse("admin:zsched_zschedjob_changelist"), {
        "action": "resume_jobs", "index": "0", "_selected_action": [str(row.pk)],
        "note": "target is back"}, follow=True)
    admin_client.post(reverse("admin:zsched_zschedjob_changelist"), {
        "action": "pause_jobs", "index": "0", "_selected_action": [str(row.pk)],
        "note": "site asked us to stop"}, follow=True)
    action(admin_client, "run_now_jobs", [row.job_id])  # paused: run now still queues it
    changes = trail(row.job_id)
    assert [(c.action, c.note) for c in changes] == [
        ("run_now", ""), ("pause", "site asked us to stop"), ("resume", "target is back"),
        ("pause", "")]
    assert {(c.actor_kind, c.actor_name) for c in changes} == {("admin", admin_user.username)}
    assert changes[1].diff == {"enabled": [True, False]}


def test_the_pause_button_on_the_job_page_takes_a_note(
        admin_client: Client, zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    row = saved(2)
    page = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    assert 'name="note"' in page
    admin_client.post(reverse("admin:zsched_zschedjob_pause", args=[row.pk]),
                      {"note": "maintenance window"})
    assert zstore.get(row.job_id).paused
    pause = trail(row.job_id)[0]
    assert (pause.action, pause.actor_kind, pause.note) == ("pause", "admin",
                                                           "maintenance window")


def test_a_note_too_long_changes_nothing(
        admin_client: Client, zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    row = saved(3)
    response = admin_client.post(reverse("admin:zsched_zschedjob_pause", args=[row.pk]),
                                 {"note": "x" * (audit.NOTE_MAX + 1)}, follow=True)
    assert "note: must be at most 1000 characters" in response.content.decode()
    assert not zstore.get(row.job_id).paused


def test_admin_delete_is_recorded_and_the_trail_outlives_the_row(
        admin_client: Client, admin_user: User, zstore: Store,
        capture: Callable[[], Any]) -> None:
    row = add_in_admin(admin_client, capture, url="https://a.example/gone", interval_s="60")
    with capture():
        response = admin_client.post(reverse("admin:zsched_zschedjob_delete", args=[row.pk]),
                                     {"post": "yes"})
    assert response.status_code == 302
    assert not ZSchedJob.objects.filter(pk=row.pk).exists()
    assert actions(row.job_id) == [("delete", "admin", admin_user.username),
                                   ("create", "admin", admin_user.username)]


def test_dead_letter_requeue_in_the_admin_is_recorded(
        admin_client: Client, settings: Any, saved: Callable[..., ZSchedJob]) -> None:
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    store = conf.get_store()
    row = saved(4, retry_max=0)
    kill(store, [row.to_job()])
    admin_client.post(reverse(DEAD), {"action": "requeue", "_selected_action": [row.job_id],
                                      "note": "upstream fixed"}, follow=True)
    requeue = trail(row.job_id)[0]
    assert (requeue.action, requeue.actor_kind, requeue.note) == (
        "requeue", "admin", "upstream fixed")


@pytest.mark.django_db(transaction=True)
def test_import_records_creates_and_a_reimport_records_nothing(
        tmp_path: Path, zstore: Store) -> None:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps([{"url": f"https://b.example/{i}", "interval_s": 60}
                                for i in range(5)]))
    quiet = {"stdout": io.StringIO(), "stderr": io.StringIO()}
    call_command("zsched_import", "--file", str(path), **quiet)
    call_command("zsched_import", "--file", str(path), "--update", **quiet)
    drain_changes()
    rows = list(ZSchedJobChange.objects.all())
    assert len(rows) == 5
    assert {(r.action, r.actor_kind, r.actor_name) for r in rows} == {
        ("create", "import", f"{audit.local_user()}:jobs.json")}


@pytest.mark.django_db(transaction=True)
def test_reconcile_records_its_pushes_and_prunes(
        zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(5, name="before")
    zstore.upsert(Job.from_dict({"id": "orphan", "url": "https://c.example/orphan",
                                 "interval_s": 60}))
    # update() and bulk_create() send no signal: Redis learns of them from reconcile.
    ZSchedJob.objects.filter(pk=row.pk).update(name="after")
    ZSchedJob.objects.bulk_create([ZSchedJob(job_id="fresh", url="https://c.example/new",
                                             interval_s=60)])
    reconcile()
    assert actions("fresh") == [("create", "reconcile", audit.local_user())]
    edit = trail(row.job_id)[0]
    assert (edit.action, edit.actor_kind, edit.diff) == (
        "edit", "reconcile", {"name": ["before", "after"]})
    assert edit.actor_name == audit.local_user()
    assert [(c.action, c.actor_kind) for c in trail("orphan")] == [
        ("delete", "reconcile"), ("create", "api")]


def test_the_drain_is_idempotent_and_part_of_the_history_drain(
        zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    rows = [saved(10 + n) for n in range(3)]
    zstore.pause(rows[0].job_id, note="one")
    report = drain()
    assert report.changes == 4  # three creates and a pause
    assert drain().changes == 0
    # A crash between the insert and the cursor write: the same entries again.
    zstore.client.delete(*(keys.audit_cursor for keys in zstore.parts))
    again = drain_changes()
    assert (again.read, again.created) == (4, 0)
    assert ZSchedJobChange.objects.count() == 4


@pytest.mark.parametrize("partitions", [3])
def test_the_drain_keeps_partitions_apart(
        settings: Any, partitions: int, saved: Callable[..., ZSchedJob]) -> None:
    settings.CELERY_ZSCHED_PARTITIONS = partitions
    rows = [saved(20 + n) for n in range(12)]
    report = drain_changes()
    assert (report.read, report.created) == (12, 12)
    assert {c.job_id for c in ZSchedJobChange.objects.all()} == {r.job_id for r in rows}
    assert all("/" in c.stream_id for c in ZSchedJobChange.objects.all())
    assert drain_changes().created == 0


def test_the_job_page_shows_its_newest_changes_inline(
        admin_client: Client, zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    row = saved(30, name="inline")
    zstore.pause(row.job_id, note="why not")
    # No drain before the page: the page copies what is pending itself.
    html = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    section = html[html.lower().index("recent changes (newest"):]
    assert "why not" in section
    assert section.index("Paused") < section.index("Created")  # newest first
    assert "enabled" in section  # the pause's diff


def test_the_change_list_searches_and_filters(
        admin_client: Client, zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    a, b = saved(40), saved(41)
    zstore.pause(a.job_id, by=audit.Actor("cli", "alice@ops"), note="rate limited")
    zstore.pause(b.job_id, by=audit.Actor("cli", "bob@ops"), note="moved")

    def shown(query: str) -> set[str]:
        response = admin_client.get(reverse(CHANGES) + query)
        assert response.status_code == 200
        return {c.job_id for c in response.context["cl"].result_list}

    assert shown("") == {a.job_id, b.job_id}
    assert shown("?q=rate+limited") == {a.job_id}
    assert shown("?q=bob") == {b.job_id}
    assert shown(f"?q={a.job_id}") == {a.job_id}
    assert shown("?action__exact=pause&actor_kind__exact=cli") == {a.job_id, b.job_id}
    assert shown("?action__exact=create") == {a.job_id, b.job_id}
    assert shown("?actor_kind__exact=admin") == set()
    html = admin_client.get(reverse(CHANGES) + "?q=rate").content.decode()
    assert "enabled" in html and "alice@ops" in html


def test_the_trail_is_read_only_and_visible_to_job_viewers(
        client: Client, zstore: Store, saved: Callable[..., ZSchedJob]) -> None:
    row = saved(50)
    drain_changes()
    change = ZSchedJobChange.objects.get()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(viewer)
    assert client.get(reverse(CHANGES)).status_code == 200
    url = reverse("admin:zsched_zschedjobchange_change", args=[change.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"note": "rewritten"}).status_code == 403
    assert client.post(reverse("admin:zsched_zschedjobchange_delete", args=[change.pk]),
                       {"post": "yes"}).status_code == 403
    assert client.get(reverse("admin:zsched_zschedjobchange_add")).status_code == 403
    assert ZSchedJobChange.objects.get().note == ""
    assert row.job_id == change.job_id


@pytest.mark.parametrize("partitions", [3])
def test_a_repartition_after_a_drain_copies_nothing_twice(
        settings: Any, partitions: int, saved: Callable[..., ZSchedJob]) -> None:
    settings.CELERY_ZSCHED_PARTITIONS = partitions
    rows = [saved(60 + n) for n in range(9)]
    assert drain_changes().created == 9
    store = conf.get_store()
    store.pause(rows[0].job_id, note="after the drain")
    repartition(store.client, store.settings, 1)
    settings.CELERY_ZSCHED_PARTITIONS = 1
    report = drain_changes()
    assert report.created == 1  # the pause; the creates were drained before the move
    assert ZSchedJobChange.objects.count() == 10
    [pause] = ZSchedJobChange.objects.filter(action="pause")
    assert (pause.job_id, pause.note) == (rows[0].job_id, "after the drain")
