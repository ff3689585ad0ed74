"""The admin dashboard against real Redis and the test database: the due histogram
counts what is due in each bucket, the lateness percentiles are the nearest-rank
ones (from run history, and from the settle stream without it), states and dead
letters come from the store's counters, only staff with view permission see it,
and one render costs the same Redis commands at 1,000 jobs as at 10,000.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf, dashboard
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.contrib.django.stats import percentile
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.dead_letters import dead_job, kill
from tests.helpers import settle_all

pytestmark = pytest.mark.django_db

URL = "admin:zsched_dashboard"
MIN = 60_000


def jobs_due(store: Store, due: dict[str, int]) -> None:
    """Store one interval job per id, first due at the given epoch ms (the bulk path)."""
    jobs = [Job.from_dict({"id": job_id, "task": "tests.noop", "interval_s": 86400 * 7,
                           "jitter_s": 0}) for job_id in due]
    store.upsert_many(jobs, first_due=dict(due))


def runs(start: datetime, lateness: list[int | None], status: str = "complete",
         tag: str = "") -> list[ZSchedRun]:
    """Run rows finished a minute into the hour ``start``, one per lateness value."""
    return [ZSchedRun(job_id=f"job{i}", occurrence=i, status=status,
                      finished_at=start + timedelta(minutes=1, seconds=i % 3000),
                      lateness_ms=value, stream_id=f"{tag}{start.timestamp()}-{status}-{i}")
            for i, value in enumerate(lateness)]


@pytest.fixture
def partitioned(settings: Any) -> Store:
    """The Django store, split in three partitions (the histogram sums them)."""
    settings.CELERY_ZSCHED_PARTITIONS = 3
    return conf.get_store()


# ---------------------------------------------------------------- due load
def test_due_histogram_counts_known_due_times_in_their_buckets(partitioned: Store) -> None:
    store = partitioned
    now = store.now_ms()
    bucket = dashboard.DUE_BUCKET_MS
    due = {
        "late-a": now - 5 * MIN, "late-b": now - 86_400_000,        # overdue
        "b0-a": now, "b0-b": now + 10 * MIN, "b0-c": now + bucket - 1,  # bucket 0
        "b1": now + bucket,                                          # bucket 1 starts here
        "b47": now + 47 * bucket + 5 * MIN,                          # the last bucket
        "later": now + 48 * bucket,                                  # past 24 h: not shown
    }
    jobs_due(store, due)
    load = dashboard.due_load(store, now)
    expected = [0] * dashboard.DUE_BUCKETS
    expected[0], expected[1], expected[47] = 3, 1, 1
    assert load.overdue == 2
    assert load.counts == expected
    chart = dashboard.due_chart(load)
    assert "2 jobs overdue" in chart and chart.count("<rect class=\"bar\"") == 49


def test_due_load_counts_http_jobs_when_asked(partitioned: Store) -> None:
    """HTTP jobs wait in their own schedules: the histogram counts them with ``http``
    (the page asks when ``stats()`` says some wait)."""
    store = partitioned
    now = store.now_ms()
    bucket = dashboard.DUE_BUCKET_MS
    jobs_due(store, {"celery-late": now - 5 * MIN, "celery-b1": now + bucket})
    http = {"http-late": now - MIN, "http-b0": now + MIN, "http-b1": now + bucket + MIN}
    store.upsert_many([Job.from_dict({"id": job_id, "url": f"https://example.org/{job_id}",
                                      "interval_s": 86400 * 7, "jitter_s": 0,
                                      "transport": "http"}) for job_id in http],
                      first_due=dict(http))
    assert store.stats()["http_scheduled"] == 3
    beat_only = dashboard.due_load(store, now)
    assert (beat_only.overdue, beat_only.counts[:2]) == (1, [0, 1])
    both = dashboard.due_load(store, now, http=True)
    assert (both.overdue, both.counts[:2]) == (2, [1, 2])
    assert sum(both.counts) == 3


# ---------------------------------------------------------- lateness, outcomes
def test_lateness_percentiles_are_nearest_rank_per_hour_from_history(zstore: Store) -> None:
    now = zstore.now_ms()
    starts = dashboard.hour_starts(now, dashboard.HOURS)
    hundred = list(range(1, 101))
    random.Random(7).shuffle(hundred)
    ZSchedRun.objects.bulk_create(
        runs(starts[-1], [*hundred, None])                  # the current hour
        + runs(starts[-3], [30, 10, 20], tag="a")           # two hours ago
        + runs(starts[-3], [7000], status="error", tag="b")
        + runs(starts[0], [5], status="retrying")           # the oldest hour shown
        + runs(starts[0] - timedelta(hours=1), [99999], tag="old"))  # outside the window
    window = dashboard.run_window(zstore, now)
    assert window.source == "run history"
    by_hour = {h.start: h for h in window.hours}
    assert by_hour[starts[-1]].lateness == {50: 50, 99: 99}
    assert by_hour[starts[-1]].runs == 101
    assert by_hour[starts[-3]].lateness == {50: 20, 99: 7000}
    assert by_hour[starts[-3]].outcomes == {"complete": 3, "error": 1}
    assert by_hour[starts[0]].lateness == {50: 5, 99: 5}
    assert by_hour[starts[0]].outcomes == {"retrying": 1}
    assert sum(h.runs for h in window.hours) == 101 + 4 + 1
    assert by_hour[starts[-2]].lateness == {} and by_hour[starts[-2]].runs == 0


@pytest.mark.parametrize("size", [1, 2, 3, 37, 200])
def test_sql_percentiles_equal_the_python_nearest_rank(zstore: Store, size: int) -> None:
    now = zstore.now_ms()
    start = dashboard.hour_starts(now, 1)[0]
    values = [random.Random(size).randrange(-500, 100_000) for _ in range(size)]
    ZSchedRun.objects.bulk_create(runs(start, list(values)))
    hour = dashboard.run_window(zstore, now, hours=1).hours[0]
    ordered = sorted(values)
    assert hour.lateness == {50: percentile(ordered, 50), 99: percentile(ordered, 99)}


def test_without_history_the_settle_stream_gives_the_figures(zstore: Store) -> None:
    jobs = [Job.from_dict({"id": f"s{i}", "task": "tests.noop", "interval_s": 3600})
            for i in range(4)]
    zstore.upsert_many(jobs, stagger=False)
    zstore.run_now(*(job.id for job in jobs))
    claimed = zstore.claim(100).jobs
    assert len(claimed) == 4
    for c, (outcome, late) in zip(claimed, [("complete", 100), ("complete", 300),
                                            ("complete", 200), ("error", 900)], strict=True):
        zstore.settle(c.job.id, c.occurrence, c.attempt, outcome, error="boom",
                      event={"lateness_ms": late})
    window = dashboard.run_window(zstore, zstore.now_ms())
    assert window.source == "the settle stream"
    # The last hour, or the one before if the clock just struck the hour.
    [current] = [hour for hour in window.hours if hour.runs]
    assert current.lateness == {50: 200, 99: 900}
    assert current.outcomes == {"complete": 3, "retrying": 1}


# ------------------------------------------------------------------- page
def test_the_page_shows_states_dead_letters_and_charts(
        admin_client: Client, settings: Any) -> None:
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    store = conf.get_store()
    kill(store, [dead_job("dead1")])
    now = store.now_ms()
    jobs_due(store, {f"j{i}": now + i * MIN for i in range(1, 6)})
    store.pause("j1", "j2")
    response = admin_client.get(reverse(URL))
    assert response.status_code == 200
    stats = response.context["stats"]
    assert (stats["jobs"], stats["paused"], stats["dead"]) == (6, 2, 1)
    html = response.content.decode()
    # Due load, lateness, outcomes, states, and the sampled recrawl intervals.
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="zsched-chart"') == 5
    assert 'role="img"' in html and "<desc" in html
    assert "2 paused" in html and "1 dead" in html
    assert f'href="{reverse("admin:zsched_dead_letters")}"' in html
    assert response.context["dead_ids"] == ["dead1"]
    assert "<script" not in html.split('id="content-main"')[1]  # the charts need none


def test_throttled_domains_and_open_breakers_link_to_their_pages(
        admin_client: Client, settings: Any) -> None:
    settings.CELERY_ZSCHED_PACING = True
    settings.CELERY_ZSCHED_DOMAIN_DELAY_S = 0
    settings.CELERY_ZSCHED_DOMAIN_MAX_IN_FLIGHT = 0
    settings.CELERY_ZSCHED_BREAKER_MIN_REQUESTS = 2
    store = conf.get_store()
    settle_all(store, "slow.example", 1, "error", 429, retry_after_s=120)
    settle_all(store, "down.example", 3, "error", 500)
    settle_all(store, "fine.example", 1, "complete", 200)
    response = admin_client.get(reverse(URL))
    assert response.status_code == 200
    assert (response.context["throttled_count"], response.context["breakers_count"]) == (1, 1)
    html = response.content.decode()
    for name in ("slow.example", "down.example"):
        link = reverse("admin:zsched_domain_change", args=[name])
        assert f'<a href="{link}">{name}</a>' in html
    assert "fine.example" not in html


def test_the_job_list_and_the_app_page_link_to_it(admin_client: Client) -> None:
    link = f'href="{reverse(URL)}"'
    assert link in admin_client.get(reverse("admin:zsched_zschedjob_changelist")
                                     ).content.decode()
    assert link in admin_client.get(reverse("admin:app_list", args=["zsched"])).content.decode()


def test_redis_down_is_said_on_the_page(admin_client: Client, settings: Any) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"
    response = admin_client.get(reverse(URL))
    assert response.status_code == 200
    assert "Redis unavailable" in response.content.decode()


# ------------------------------------------------------------- permissions
def test_only_staff_with_view_permission_see_it(client: Client) -> None:
    # force_login: no password hashing, which is most of a login's time.
    client.force_login(User.objects.create(username="plain"))
    response = client.get(reverse(URL))
    assert response.status_code == 302 and "/login/" in response["Location"]

    client.force_login(User.objects.create(username="nobody", is_staff=True))
    assert client.get(reverse(URL)).status_code == 403

    viewer = User.objects.create(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(viewer)
    assert client.get(reverse(URL)).status_code == 200


# ------------------------------------------------------------------- cost
def commands_per_render(client: Client, rclient: redis.Redis) -> dict[str, int]:
    """Redis commands one render sends (INFO commandstats, reset just before)."""
    rclient.config_resetstat()
    assert client.get(reverse(URL)).status_code == 200
    stats = rclient.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()
            if name not in ("cmdstat_config|resetstat", "cmdstat_info", "cmdstat_config")}


def test_redis_commands_per_render_do_not_grow_with_the_jobs(
        admin_client: Client, partitioned: Store, rclient: redis.Redis,
        make_row: Callable[..., ZSchedJob]) -> None:
    store = partitioned
    now = store.now_ms()
    admin_client.get(reverse(URL))  # sessions, script loads: nothing of the page's own
    jobs_due(store, {f"a{i}": now + (i * 7919) % 86_400_000 for i in range(1000)})
    small = commands_per_render(admin_client, rclient)
    jobs_due(store, {f"b{i}": now + (i * 7919) % 86_400_000 for i in range(9000)})
    assert store.stats()["jobs"] == 10_000
    large = commands_per_render(admin_client, rclient)
    assert small == large
    # 49 ZCOUNTs per partition for the histogram (no HTTP job waits), 7 in the
    # stats pipeline (due now, next minute, next hour, of each schedule; jobs held
    # back by their queue's bound), a few more.
    assert small["zcount"] == 3 * (dashboard.DUE_BUCKETS + 1) + 3 * 7
    assert sum(small.values()) < 3 * 70
