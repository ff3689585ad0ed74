"""The admin's Dead letters page against real Redis: it renders the CLI's columns,
its requeue and purge actions write through to Redis (one call over the
selection) and to the ``enabled`` column, only users with the change
permission may act, and ``zsched_sync`` never loses a dead letter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store
from tests.dead_letters import kill

pytestmark = pytest.mark.django_db

DEAD = "admin:zsched_dead_letters"
ERROR = "HTTP 503: upstream down"


@pytest.fixture
def dying(settings: Any) -> Store:
    """The Django store with a lease that runs out at once, and one crash to die."""
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    return conf.get_store()  # a new one: changing a setting reset the cached store


@pytest.fixture
def dead_rows(dying: Store, make_row: Callable[..., ZSchedJob]) -> list[ZSchedJob]:
    """Three saved jobs, all dead-lettered in Redis."""
    rows = [make_row(n, name=f"page {n}", retry_max=0) for n in range(3)]
    kill(dying, [row.to_job() for row in rows])
    return rows


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def dead_ids(store: Store) -> set[str]:
    return {str(m) for m in store.client.zrange(store.keys.dead, 0, -1)}


def states(store: Store) -> dict[str, RuntimeState]:
    return {str(i): RuntimeState.from_wire(raw)
            for i, raw in store.client.hgetall(store.keys.state).items()}


def post(client: Client, action: str, *ids: str) -> Any:
    return client.post(reverse(DEAD), {"action": action, "_selected_action": list(ids)},
                       follow=True)


# --------------------------------------------------------------------- page
def test_the_job_list_links_to_an_empty_page(admin_client: Client, dying: Store) -> None:
    jobs = admin_client.get(reverse("admin:zsched_zschedjob_changelist")).content.decode()
    assert f'href="{reverse(DEAD)}"' in jobs and ">Dead letters</a>" in jobs
    response = admin_client.get(reverse(DEAD))
    assert response.status_code == 200
    assert "No dead letters." in response.content.decode()


def test_the_page_shows_each_dead_letter_with_the_cli_columns(
        admin_client: Client, dead_rows: list[ZSchedJob]) -> None:
    response = admin_client.get(reverse(DEAD))
    assert response.status_code == 200
    html = response.content.decode()
    for header in ("Job id", "Name / URL", "Task", "Died (UTC)", "Deliveries", "Last error"):
        assert f">{header}</th>" in html
    rows = {row["id"]: row for row in response.context["rows"]}
    assert set(rows) == {row.job_id for row in dead_rows}
    first = dead_rows[0]
    row = rows[first.job_id]
    assert row["target"] == f"page 0 {first.url}"
    assert (row["deliveries"], row["error"]) == (1, ERROR)
    assert row["died"].endswith("Z") and row["ago"].endswith(" ago")
    assert row["change_url"] == reverse("admin:zsched_zschedjob_change", args=[first.pk])
    assert f'value="{first.job_id}" class="action-select"' in html
    assert ">Requeue selected dead letters</option>" in html
    assert "3 dead letters" in html


# ------------------------------------------------------------------ actions
def test_requeue_writes_through_in_one_redis_call(
        admin_client: Client, dying: Store, dead_rows: list[ZSchedJob],
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, third = (row.job_id for row in dead_rows)
    dying.pause(first)  # a dead job that was paused too: requeue runs it anyway
    ZSchedJob.objects.filter(job_id=first).update(enabled=False)
    calls: list[int] = []
    original = Store._run

    def counted(self: Store, batch: Any) -> list[Any]:
        calls.append(len(batch))
        return original(self, batch)
    monkeypatch.setattr(Store, "_run", counted)
    response = post(admin_client, "requeue", first, second)
    assert messages_of(response) == ["Requeued 2 dead letters."]
    assert calls == [1]
    assert dead_ids(dying) == {third}
    now = dying.now_ms()
    for job_id in (first, second):
        info = dying.get(job_id)
        assert (info.status, info.paused) == ("scheduled", False)
        assert info.due_ms is not None and info.due_ms <= now
        assert (info.state.crashes, info.state.consecutive_failures) == (0, 0)
    assert ZSchedJob.objects.get(job_id=first).enabled
    # A second click on a stale page changes nothing, and says so.
    again = post(admin_client, "requeue", first, third)
    assert messages_of(again) == ["Requeued 1 dead letter (1 no longer dead-lettered, "
                                  "left alone)."]


def test_purge_keeps_the_job_paused_and_a_reconcile_keeps_it_so(
        admin_client: Client, dying: Store, dead_rows: list[ZSchedJob]) -> None:
    first, second, third = (row.job_id for row in dead_rows)
    response = post(admin_client, "purge", first, second)
    assert messages_of(response) == ["Purged (jobs kept, paused) 2 dead letters."]
    assert dead_ids(dying) == {third}
    for job_id in (first, second):
        assert (dying.get(job_id).status, dying.get(job_id).paused) == ("paused", True)
        assert not ZSchedJob.objects.get(job_id=job_id).enabled
    reconcile()
    assert {dying.get(i).status for i in (first, second)} == {"paused"}
    assert dead_ids(dying) == {third}


def test_no_action_or_no_selection_changes_nothing(admin_client: Client, dying: Store,
                                                    dead_rows: list[ZSchedJob]) -> None:
    before = states(dying)
    assert messages_of(post(admin_client, "", dead_rows[0].job_id)) == ["Choose an action."]
    assert messages_of(post(admin_client, "requeue")) == [
        "Select dead letters to act on; nothing changed."]
    assert states(dying) == before and len(dead_ids(dying)) == 3


# -------------------------------------------------------------- permissions
def test_viewers_see_dead_letters_but_cannot_act(client: Client, dying: Store,
                                                 dead_rows: list[ZSchedJob]) -> None:
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(viewer)
    page = client.get(reverse(DEAD))
    assert page.status_code == 200
    assert len(page.context["rows"]) == 3
    assert b"action-select" not in page.content and b'name="action"' not in page.content
    before = states(dying)
    for action in ("requeue", "purge"):
        assert client.post(reverse(DEAD), {"action": action, "_selected_action": [
            dead_rows[0].job_id]}).status_code == 403
    assert states(dying) == before and len(dead_ids(dying)) == 3
    assert ZSchedJob.objects.filter(enabled=True).count() == 3

    nobody = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(nobody)
    assert client.get(reverse(DEAD)).status_code == 403


def test_redis_down_shows_on_the_page(admin_client: Client, dying: Store,
                                      settings: Any) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"  # refuses at once
    response = admin_client.get(reverse(DEAD))
    assert response.status_code == 200
    assert "Redis unavailable" in response.content.decode()
    failed = post(admin_client, "requeue", "x")
    assert messages_of(failed)[0].startswith("Nothing changed: ")


# ------------------------------------------------------ reconcile keeps them
def test_a_reconcile_never_loses_a_dead_letter(dying: Store,
                                               dead_rows: list[ZSchedJob]) -> None:
    """zsched_sync upserts rows whose definition differs (here: an edit made with
    update(), which sends no signal) and mirrors the rest; neither revives them."""
    ids = {row.job_id for row in dead_rows}
    before = states(dying)
    call_command("zsched_sync", verbosity=0)
    assert dead_ids(dying) == ids
    assert states(dying) == before
    ZSchedJob.objects.filter(job_id=dead_rows[0].job_id).update(interval_s=30.0)
    report = reconcile()
    assert report.changed == 1
    assert dying.get(dead_rows[0].job_id).job.interval_s == 30.0
    assert dead_ids(dying) == ids
    assert {dying.get(i).status for i in ids} == {"dead"}
    assert {i: (s.crashes, s.last_error) for i, s in states(dying).items()} == {
        i: (1, ERROR) for i in ids}
    assert dying.claim(100).jobs == []
