"""The capacity planner and the delay's source in the admin: the Domains pages and the
dashboard flag an over-subscribed domain (real Redis, the test database)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf
from celery_zsched.core.job import Job
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db


@pytest.fixture
def paced(settings: Any, zstore: Store) -> Store:
    """Pacing on at a 2 s delay: 43,200 fetches a day per domain."""
    settings.CELERY_ZSCHED_PACING = True
    settings.CELERY_ZSCHED_DOMAIN_DELAY_S = 2.0
    store = conf.get_store()  # a new one: changing a setting reset the cached store
    jobs = [Job.from_dict({"url": f"http://over.example/{i}", "interval_s": 60})
            for i in range(60)]
    jobs += [Job.from_dict({"url": f"http://fine.example/{i}", "interval_s": 3600})
             for i in range(10)]
    store.upsert_many(jobs)
    return store


def test_the_domains_page_flags_the_oversubscribed_domain(admin_client: Client,
                                                          paced: Store) -> None:
    response = admin_client.get(reverse("admin:zsched_domains"))
    assert response.status_code == 200
    rows = {cells["name"]: cells for cells, _change, _reset in response.context["rows"]}
    # Domains with jobs and no pacing state yet are listed too.
    assert list(rows) == ["fine.example", "over.example"]
    over = rows["over.example"]
    assert over["oversubscribed"] and over["demand"] == "OVER 2.00x: 86.4k/43.2k"
    assert over["lateness"] == "~1m" and over["delay_source"] == "config"
    assert not rows["fine.example"]["oversubscribed"]
    html = response.content.decode()
    assert "zsched-oversubscribed" in html and "Delay from" in html
    only = admin_client.get(reverse("admin:zsched_domains") + "?over=1")
    assert [c["name"] for c, _x, _y in only.context["rows"]] == ["over.example"]
    page = admin_client.get(reverse("admin:zsched_domain_change", args=["over.example"]))
    assert page.context["cells"]["demand"] == "OVER 2.00x: 86.4k/43.2k"


def test_the_dashboard_lists_the_oversubscribed_domain(admin_client: Client,
                                                       paced: Store) -> None:
    response = admin_client.get(reverse("admin:zsched_dashboard"))
    assert response.status_code == 200
    assert response.context["oversubscribed_count"] == 1
    link = reverse("admin:zsched_domain_change", args=["over.example"])
    assert response.context["oversubscribed_rows"] == [("over.example", link, "2.00x", "~1m")]
    html = response.content.decode()
    assert f'<a href="{link}">over.example</a> 2.00x, ~1m late' in html
