"""Every admin URL of the app, walked with hostile query strings, path values and posts:
an answer below 500 each time (a page, a redirect, a 400, a 403 or a 404), never a crash.

The URLs come from the admin site's own URL patterns, so a view added later is walked
too. Deterministic cases (the ones that crashed: ``?o=7``, ``?o=-7``, ``?o=20``, a note
of 5,000 characters on a dead-letter action) come first; then a property-based run over
query strings of every listing view.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedJobChange, ZSchedRun
from celery_zsched.core.audit import NOTE_MAX
from celery_zsched.store import Store
from tests.django.test_admin import bulk_jobs, fail

pytestmark = pytest.mark.django_db

#: Query strings a careless or hostile user may send to any view.
HOSTILE_QUERIES = [
    "o=7", "o=-7", "o=20", "o=-20", "o=99999999999999999999", "o=x", "o=1.-2.7.x", "o=",
    "o=-", "o=--1", "p=-1", "p=0", "p=99999", "p=x", "all=", "q=%00", "q=" + "x" * 5000,
    "q=%3Cscript%3E", "e=1", "_to_field=password", "_popup=1&_to_field=id",
    "transport__exact=bogus", "status=%F0%9F%98%80", "unknown_filter=1",
    "enabled__exact=maybe", "host=..%2F..", "page=-3", "limit=-1", "n=99999999",
    "q=%ED%A0%80", "o=3&o=4", "hours=-1", "hours=1e400", "at=not-a-time",
]
#: Values for a path parameter, besides a real one.
HOSTILE_IDS = ["0", "-1", "abc", "99999999999999999999", "..", "%00", "a" * 300, "%F0%9F%98%80"]


def admin_urls() -> Iterator[tuple[str, str]]:
    """(pattern, name) of every URL under the app's admin."""
    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, str]]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern), pattern.name or ""
    for route, name in walk(get_resolver().url_patterns, "/"):
        if route.startswith("/admin/zsched/"):
            yield route, name


def _fill(route: str, value: str) -> str:
    return re.sub(r"<(?:\w+:)?\w+>", value, route)


@pytest.fixture
def admin(admin_client: Client, zstore: Store) -> tuple[Client, dict[str, str]]:
    """A superuser's client, and a real id for each path parameter kind."""
    row = bulk_jobs(zstore, 1)[0]
    fail(zstore, row.job_id, 2, error="HTTP 500 \x1b[2J")
    zstore.pause(row.job_id, note="walk")
    drain()
    run = ZSchedRun.objects.first()
    change = ZSchedJobChange.objects.first()
    real = {"zschedjob": str(row.pk), "zschedrun": str(run.pk if run else 1),
            "zschedjobchange": str(change.pk if change else 1), "domains": "127.0.0.1"}
    return admin_client, real


def _real_id(route: str, real: dict[str, str]) -> str:
    return next((value for key, value in real.items() if f"/{key}/" in route), "1")


def _ok(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code}"


def test_every_admin_url_answers_hostile_queries_without_a_server_error(
        admin: tuple[Client, dict[str, str]]) -> None:
    client, real = admin
    urls = list(admin_urls())
    assert len(urls) >= 20, urls  # the walk found the app's views
    for route, name in urls:
        for value in [_real_id(route, real), *HOSTILE_IDS] if "<" in route else [""]:
            url = _fill(route, value)
            for query in HOSTILE_QUERIES:
                _ok(client.get(f"{url}?{query}"), f"GET {url}?{query[:60]} ({name})")


def test_every_admin_post_answers_hostile_forms_without_a_server_error(
        admin: tuple[Client, dict[str, str]]) -> None:
    client, real = admin
    long_note = "n" * (NOTE_MAX + 5000)
    forms: list[dict[str, Any]] = [
        {"note": long_note, "action": "requeue", "_selected_action": ["x", "y"]},
        {"note": long_note, "action": "purge", "_selected_action": ["1"]},
        {"action": "bogus", "_selected_action": ["1"], "index": "0"},
        {"action": "pause_jobs", "_selected_action": ["abc", "-1"], "index": "0",
         "note": long_note},
        {"action": "run_now", "select_across": "1", "index": "0", "note": long_note,
         "_selected_action": ["0"]},
        {"note": "\x00", "delay_s": "-1", "max_in_flight": "x" * 500, "_selected_action": "1"},
        {"csrfmiddlewaretoken": "x", "job_id": "..", "url": "javascript:alert(1)"},
    ]
    for route, name in admin_urls():
        url = _fill(route, _real_id(route, real)) if "<" in route else route
        for form in forms:
            _ok(client.post(url, form), f"POST {url} ({name}) {sorted(form)}")


def test_a_dead_letter_action_with_a_long_note_is_an_error_message_and_changes_nothing(
        admin: tuple[Client, dict[str, str]], zstore: Store) -> None:
    client, _ = admin
    job_id = ZSchedJob.objects.first().job_id  # type: ignore[union-attr]
    response = client.post("/admin/zsched/zschedjob/dead-letters/",
                           {"action": "requeue", "_selected_action": [job_id],
                            "note": "n" * (NOTE_MAX + 1)}, follow=True)
    assert response.status_code == 200
    assert any("note" in str(m) and "at most" in str(m) for m in response.context["messages"])
    assert zstore.get(job_id).paused  # the requeue did not happen


@pytest.mark.parametrize("order", ["7", "-7", "20", "-20", "3.7", "99999999999999999999"])
def test_every_o_value_sorts_or_is_ignored(admin: tuple[Client, dict[str, str]],
                                           order: str) -> None:
    client, _ = admin
    response = client.get(f"/admin/zsched/zschedjob/?o={order}")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(query=st.lists(st.tuples(st.sampled_from(["o", "p", "q", "all", "e", "status",
                                                 "transport__exact", "enabled__exact",
                                                 "kind", "hours", "_popup", "x"]),
                                st.text(max_size=40)), max_size=4),
       view=st.sampled_from(["zschedjob/", "zschedrun/", "zschedjobchange/",
                             "zschedjob/dead-letters/", "zschedjob/domains/",
                             "zschedjob/dashboard/", "zschedjob/preview/"]))
def test_any_query_string_on_any_listing_view_is_not_a_server_error(
        admin: tuple[Client, dict[str, str]], query: list[tuple[str, str]], view: str) -> None:
    client, _ = admin
    response = client.get(f"/admin/zsched/{view}", dict(query))
    assert response.status_code < 500, (view, query)
