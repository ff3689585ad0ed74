"""The admin's next fire times: the JSON endpoint behind the live preview, its
permission check, the change page's table of 10, and the add form's block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db

PREVIEW = "admin:zsched_zschedjob_preview"


def ask(client: Client, **query: str) -> Any:
    return client.get(reverse(PREVIEW), query)


def test_the_endpoint_returns_ten_fires_in_the_zone(admin_client: Client) -> None:
    response = ask(admin_client, cron="0 12 * * *", timezone="America/New_York", jitter_s="60")
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "scheduled" and data["timezone"] == "America/New_York"
    assert len(data["fires"]) == 10
    assert all("T12:00:00-0" in f["local"] and f["jitter_s"] == 60 for f in data["fires"])


def test_an_interval_preview_and_the_default_zone(admin_client: Client) -> None:
    data = ask(admin_client, interval_s="3600", max_runs="3").json()
    # TIME_ZONE of the test settings is the default zone of a job.
    assert data["timezone"] == "Europe/Berlin"
    assert len(data["fires"]) == 3 and "max_runs (3)" in data["note"]


def test_the_endpoint_marks_dst_shifts(admin_client: Client) -> None:
    data = ask(admin_client, cron="30 2 * * *", timezone="Europe/Berlin",
               start_at="2027-03-28T00:00:00Z").json()
    assert data["fires"][0]["utc"] == "2027-03-28T01:30:00Z" and data["fires"][0]["shifted"]


@pytest.mark.parametrize(("query", "field"), [
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "0 12 * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"interval_s": "-5"}, "interval_s"),
    ({"interval_s": "60", "cron": "* * * * *"}, "cron"),
    ({"cron": "0 12 * * *", "day_rule": "xor"}, "day_rule"),
])
def test_bad_timing_gives_field_errors(admin_client: Client, query: dict[str, str],
                                       field: str) -> None:
    response = ask(admin_client, **query)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field] and errors[field][0]


def test_only_staff_with_view_permission_may_ask(client: Client) -> None:
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    assert ask(client, interval_s="60").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(User.objects.get(pk=user.pk))  # a fresh permission cache
    assert ask(client, interval_s="60").status_code == 200
    client.logout()
    # Not logged in: the admin's login page, never the fires.
    response = ask(client, interval_s="60")
    assert response.status_code == 302 and "login" in response["Location"]


def test_the_change_page_shows_the_next_10(admin_client: Client, zstore: Store,
                                           make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(cron="0 12 * * *", interval_s=None, timezone="Europe/Berlin")
    zstore.upsert(row.to_job())  # the first fire is then its due time in Redis
    html = admin_client.get(reverse("admin:zsched_zschedjob_change", args=[row.pk])
                            ).content.decode()
    box = html.split('id="zsched-next-fires"', 1)[1].split("</table>", 1)[0]
    assert f'data-url="{reverse(PREVIEW)}"' in box
    assert box.count("<tr><td>") == 10 and box.count(" 12:00:00 CE") == 10
    assert "zsched/job_preview.js" in html


def test_a_paused_job_says_paused_on_its_page(admin_client: Client, zstore: Store,
                                              make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(cron="0 12 * * *", interval_s=None)
    zstore.upsert(row.to_job())
    zstore.pause(row.job_id)  # paused in Redis: the one fact of pause
    html = admin_client.get(reverse("admin:zsched_zschedjob_change", args=[row.pk])
                            ).content.decode()
    box = html.split('id="zsched-next-fires"', 1)[1].split("</div>", 1)[0]
    assert "<table>" not in box and "paused: resume it" in box


def test_the_add_form_has_the_live_block(admin_client: Client) -> None:
    html = admin_client.get(reverse("admin:zsched_zschedjob_add")).content.decode()
    assert f'data-url="{reverse(PREVIEW)}" data-live="1"' in html
    assert "zsched/job_preview.js" in html and "http://" not in html.split("<body", 1)[0]
