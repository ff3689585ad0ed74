"""The job admin against a real (throwaway) Redis: live next runs, filters, actions, validation.

Rows reach Redis either through the admin's own saves (their on-commit
callbacks are executed with ``django_capture_on_commit_callbacks``) or, for
speed, through ``bulk_create`` plus one ``Store.upsert_many``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from celery_zsched.contrib.django import outbox
from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.job_changelist import INFO_ATTR
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core.job import Job
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:zsched_zschedjob_changelist"
ADD = "admin:zsched_zschedjob_add"
CHANGE = "admin:zsched_zschedjob_change"


# ------------------------------------------------------------------ helpers
def bulk_jobs(store: Store, count: int, start: int = 0, **fields: Any) -> list[ZSchedJob]:
    """``count`` rows in the database and Redis, without a save signal per row."""
    jobs = [Job.from_dict({"url": f"http://127.0.0.1:1/feed/{n}", "interval_s": 300,
                           "name": f"feed {n:05d}", **fields}, store.defaults)
            for n in range(start, start + count)]
    rows = ZSchedJob.objects.bulk_create([ZSchedJob.from_job(job) for job in jobs],
                                         batch_size=2000)
    store.upsert_many(jobs)
    return rows


def changelist_ids(response: Any) -> list[str]:
    return [row.job_id for row in response.context["cl"].result_list]


def action(client: Client, name: str, ids: Sequence[str] = (), *, across: bool = False,
           query: str = "") -> Any:
    data: dict[str, Any] = {"action": name, "index": "0", "_selected_action": list(ids)}
    if across:
        data["select_across"] = "1"
    pks = list(ZSchedJob.objects.filter(job_id__in=ids).values_list("pk", flat=True))
    data["_selected_action"] = [str(pk) for pk in pks] or ["0"]
    return client.post(reverse(CHANGELIST) + query, data, follow=True)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def form_data(**overrides: Any) -> dict[str, Any]:
    """POST data of the add/change form: every editable field, blank unless given."""
    data: dict[str, Any] = {
        "name": "", "url": "", "task": "", "job_id": "", "enabled": "on",
        "interval_s": "", "cron": "", "timezone": "", "day_rule": "or",
        "run_at_0": "", "run_at_1": "",
        "jitter_s": "", "start_at_0": "", "start_at_1": "", "end_at_0": "", "end_at_1": "",
        "max_runs": "", "misfire_grace_s": "", "meta": "{}", "args": "[]", "kwargs": "{}",
        "queue": "", "routing_key": "", "priority": "", "expires_s": "", "retry_max": "",
        "retry_base_s": "", "transport": "celery", "recrawl": "fixed", "min_interval_s": "",
        "max_interval_s": "", "freshness_target": "",
        # The recent-runs inline is read-only: an empty management form is enough.
        "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0",
        "runs-MIN_NUM_FORMS": "0", "runs-MAX_NUM_FORMS": "0",
        # So is the recent-changes inline (the audit trail).
        "changes-TOTAL_FORMS": "0", "changes-INITIAL_FORMS": "0",
        "changes-MIN_NUM_FORMS": "0", "changes-MAX_NUM_FORMS": "0",
    }
    data.update(overrides)
    if data.get("enabled") is False:
        del data["enabled"]
    return data


def fail(store: Store, job_id: str, times: int, error: str = "HTTP 500") -> None:
    """Make ``job_id`` run and fail ``times`` times, as a worker would report it."""
    for _ in range(times):
        store.run_now(job_id)
        batch = store.claim()
        claimed = next(c for c in batch.jobs if c.job.id == job_id)
        store.settle(job_id, claimed.occurrence, claimed.attempt, "error", error=error)


class RoundTrips:
    """Counts requests sent to Redis: a pipeline is one send, whatever its length."""

    def __init__(self) -> None:
        self.count = 0


@contextmanager
def count_round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundTrips]:
    # send_packed_command is where every command or pipeline leaves the client
    # (redis-py packs a whole pipeline into one call): one call, one round trip.
    counter = RoundTrips()
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        counter.count += 1
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    yield counter
    monkeypatch.undo()


def command_calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Callable[[], Any]:
    """Run on-commit callbacks (the Redis pushes) of what happens inside the block."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


# --------------------------------------------------------------- changelist
def test_changelist_shows_every_next_run_from_one_redis_round_trip(
        admin_client: Client, zstore: Store, rclient: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = bulk_jobs(zstore, 30)
    zstore.pause(rows[0].job_id)
    ZSchedJob.objects.create(url="http://127.0.0.1:1/only-in-the-db", name="feed zzz",
                             interval_s=60)  # no on-commit here: never reaches Redis
    zstore.client.ping()  # connect (and pass the health check) before counting

    hmgets = command_calls(rclient, "hmget")
    with count_round_trips(monkeypatch) as trips:
        response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert trips.count == 1
    # The one round trip is get_many's pipeline: HMGET of definitions and states.
    assert command_calls(rclient, "hmget") - hmgets == 2

    page = response.context["cl"].result_list
    assert len(page) == 31
    assert all(INFO_ATTR in row.__dict__ for row in page)
    html = response.content.decode()
    for info in zstore.get_many([row.job_id for row in rows[1:]]):
        assert info is not None and info.due_ms is not None
        assert timezone.localtime(ms_to_dt(info.due_ms)).isoformat() in html
    assert "paused" in html
    assert "not in Redis" in html


def test_filters_and_search(admin_client: Client, zstore: Store) -> None:
    rows = bulk_jobs(zstore, 6)
    ZSchedJob.objects.filter(pk=rows[0].pk).update(enabled=False)
    ZSchedJob.objects.filter(pk=rows[1].pk).update(kind="cron", cron="*/5 * * * *")
    ZSchedJob.objects.filter(pk=rows[2].pk).update(last_status="error", consecutive_failures=3)
    ZSchedJob.objects.filter(pk=rows[3].pk).update(last_status="complete", queue="slow")
    ZSchedJob.objects.filter(pk=rows[4].pk).update(name="Berlin weather",
                                                   url="http://127.0.0.1:1/wetter.xml")
    by_id = {r.pk: r.job_id for r in rows}

    def ids(query: str) -> set[str]:
        response = admin_client.get(reverse(CHANGELIST) + query)
        assert response.status_code == 200
        return set(changelist_ids(response))

    assert ids("?enabled__exact=0") == {by_id[rows[0].pk]}
    assert ids("?kind__exact=cron") == {by_id[rows[1].pk]}
    assert ids("?last_status=error") == {by_id[rows[2].pk]}
    assert ids("?last_status=none") == {by_id[r.pk] for r in (rows[0], rows[1], rows[4], rows[5])}
    assert ids("?queue=slow") == {by_id[rows[3].pk]}
    assert ids("?failing=yes") == {by_id[rows[2].pk]}
    assert len(ids("?failing=no")) == 5
    assert ids("?q=weather") == {by_id[rows[4].pk]}
    assert ids("?q=wetter.xml") == {by_id[rows[4].pk]}


# ------------------------------------------------------------------ actions
def test_each_action_changes_redis_and_the_database(admin_client: Client, zstore: Store) -> None:
    rows = bulk_jobs(zstore, 3)
    ids = [r.job_id for r in rows]

    response = action(admin_client, "pause_jobs", ids[:2])
    assert "Paused 2 jobs" in messages_of(response)[0]
    infos = zstore.get_many(ids)
    assert [i.paused for i in infos if i] == [True, True, False]
    assert [i.due_ms is None for i in infos if i] == [True, True, False]
    assert set(ZSchedJob.objects.filter(enabled=False).values_list("job_id", flat=True)) \
        == set(ids[:2])

    response = action(admin_client, "resume_jobs", ids[:1])
    assert "Resumed 1 job" in messages_of(response)[0]
    info = zstore.get(ids[0])
    assert not info.paused and info.due_ms is not None
    assert ZSchedJob.objects.get(job_id=ids[0]).enabled

    before = zstore.get(ids[2]).due_ms
    now = zstore.now_ms()
    action(admin_client, "run_now_jobs", ids[2:])
    due = zstore.get(ids[2]).due_ms
    assert before is not None and due is not None and now <= due < before

    fail(zstore, ids[2], 2, error="HTTP 503 from upstream")
    assert zstore.get(ids[2]).state.consecutive_failures == 2
    ZSchedJob.objects.filter(job_id=ids[2]).update(consecutive_failures=2, failure_count=2,
                                                   last_error="HTTP 503 from upstream")
    response = action(admin_client, "reset_failures_jobs", ids[2:])
    assert "Reset the failures of 1 job" in messages_of(response)[0]
    state = zstore.get(ids[2]).state
    assert state.consecutive_failures == 0 and state.failures == 0 and state.last_error is None
    row = ZSchedJob.objects.get(job_id=ids[2])
    assert (row.consecutive_failures, row.failure_count, row.last_error) == (0, 0, "")


def test_an_action_over_10000_rows_is_one_pipeline_and_a_few_statements_per_900_rows(
        admin_client: Client, zstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    bulk_jobs(zstore, 10_000)
    calls: list[int] = []
    pipelines: list[int] = []
    control, execute = Store.control, redis.client.Pipeline.execute

    def spy_control(self: Store, op: str, ids: Any, **options: Any) -> Any:
        calls.append(len(ids))
        return control(self, op, ids, **options)

    def spy_execute(self: Any, raise_on_error: bool = True) -> Any:
        pipelines.append(len(self.command_stack))
        return execute(self, raise_on_error)

    monkeypatch.setattr(Store, "control", spy_control)
    monkeypatch.setattr(redis.client.Pipeline, "execute", spy_execute)
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        response = action(admin_client, "pause_jobs", across=True)
        paused_s = time.perf_counter() - started
    monkeypatch.undo()
    assert "Paused 10000 jobs (10000 changed in Redis" in messages_of(response)[0]
    assert calls == [10_000]
    # Two pipelines: the versioned Store.control (its Lua calls chunked inside
    # one pipeline), then the redirected changelist's get_many of one page
    # (seven commands whatever the page size: HMGET x2, ZMSCORE x4 (schedule,
    # http_schedule, leases, queued), SMISMEMBER).
    assert len(pipelines) == 2 and pipelines[1] == 7
    # The rows and their outbox entries in one transaction: per 900 rows one
    # SELECT ... FOR UPDATE and one UPDATE (enabled and version), one INSERT of
    # the entries (executemany); after Redis took it, one DELETE per 800 entries.
    sql = [q["sql"] for q in queries]
    parts = math.ceil(10_000 / 900)
    assert len([q for q in sql if q.startswith('UPDATE "zsched_job"')]) == parts
    assert len([q for q in sql if 'INSERT INTO "zsched_outbox"' in q]) == 1
    assert len([q for q in sql if q.startswith('DELETE FROM "zsched_outbox"')]) == \
        math.ceil(10_000 / 800)
    assert not ZSchedOutbox.objects.exists()
    stats = zstore.stats()
    assert (stats["paused"], stats["scheduled"]) == (10_000, 0)
    assert not ZSchedJob.objects.filter(enabled=True).exists()

    started = time.perf_counter()
    response = action(admin_client, "resume_jobs", across=True)
    resumed_s = time.perf_counter() - started
    assert "Resumed 10000 jobs" in messages_of(response)[0]
    stats = zstore.stats()
    assert (stats["paused"], stats["scheduled"]) == (0, 10_000)
    assert ZSchedJob.objects.filter(enabled=True).count() == 10_000
    print(f"\n10,000-row admin actions (request incl. redirect): pause {paused_s * 1000:.0f} ms, "
          f"resume {resumed_s * 1000:.0f} ms; in the action: {messages_of(response)[0]}")


def test_staff_without_change_permission_can_neither_act_nor_press_buttons(
        client: Client, zstore: Store) -> None:
    row = bulk_jobs(zstore, 1)[0]
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(viewer)

    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    form = response.context["action_form"]  # None: no action is offered at all
    choices = [name for name, _ in form.fields["action"].choices] if form else []
    assert not {"pause_jobs", "resume_jobs", "run_now_jobs", "reset_failures_jobs"} & set(choices)

    response = action(client, "pause_jobs", [row.job_id])
    assert not zstore.get(row.job_id).paused
    assert ZSchedJob.objects.get(pk=row.pk).enabled

    page = client.get(reverse(CHANGE, args=[row.pk]))
    assert page.status_code == 200 and b'class="zsched-button"' not in page.content
    for op in ("pause", "resume", "run_now", "reset_failures"):
        url = reverse(f"admin:zsched_zschedjob_{op}", args=[row.pk])
        assert client.post(url).status_code == 403
    assert not zstore.get(row.job_id).paused


# ------------------------------------------------------------ change page
def test_a_bad_cron_is_an_inline_error_on_the_cron_field(admin_client: Client,
                                                         zstore: Store) -> None:
    response = admin_client.post(reverse(ADD), form_data(
        url="http://127.0.0.1:1/bad", cron="61 * * * *", timezone="Europe/Berlin"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["cron"]
    assert errors["cron"][0] == "'61' is not in 0-59 for minutes"
    # Rendered in the cron field's own row, not at the top of the form.
    html = response.content.decode()
    row = re.search(r'<div class="form-row[^"]*field-cron.*?</div>\s*</div>', html, re.S)
    assert row and "is not in 0-59 for minutes" in row.group(0)
    assert not ZSchedJob.objects.exists()

    response = admin_client.post(reverse(ADD), form_data(
        url="http://127.0.0.1:1/bad", cron="*/5 * * * *", timezone="Mars/Olympus"))
    assert list(response.context["adminform"].form.errors) == ["timezone"]
    response = admin_client.post(reverse(ADD), form_data(url="http://127.0.0.1:1/bad",
                                                         interval_s="0"))
    assert list(response.context["adminform"].form.errors) == ["interval_s"]


def test_a_good_cron_is_described_in_words_with_its_next_run(
        admin_client: Client, zstore: Store, capture: Callable[[], Any]) -> None:
    with capture():
        response = admin_client.post(reverse(ADD), form_data(
            name="Berlin feed", url="http://127.0.0.1:1/berlin.xml", cron="*/15 * * * *",
            timezone="Europe/Berlin"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = ZSchedJob.objects.get()
    info = zstore.get(row.job_id)
    assert info.job.cron == "*/15 * * * *" and info.due_ms is not None

    html = admin_client.get(reverse(CHANGE, args=[row.pk])).content.decode()
    assert "Every 15 minutes (Europe/Berlin time)" in html
    assert timezone.localtime(ms_to_dt(info.due_ms)).isoformat() in html


def test_change_page_buttons(admin_client: Client, zstore: Store) -> None:
    row = bulk_jobs(zstore, 1)[0]
    change = reverse(CHANGE, args=[row.pk])

    def press(op: str) -> str:
        url = reverse(f"admin:zsched_zschedjob_{op}", args=[row.pk])
        response = admin_client.post(url)
        assert response.status_code == 302 and response["Location"] == change
        return admin_client.get(change).content.decode()

    html = admin_client.get(change).content.decode()
    assert ">Pause</button>" in html and ">Run now</button>" in html
    assert admin_client.get(reverse("admin:zsched_zschedjob_pause", args=[row.pk])
                            ).status_code == 405

    html = press("pause")
    assert zstore.get(row.job_id).paused and not ZSchedJob.objects.get(pk=row.pk).enabled
    assert ">Resume</button>" in html and "Paused 1 job" in html

    html = press("resume")
    assert not zstore.get(row.job_id).paused and ZSchedJob.objects.get(pk=row.pk).enabled

    fail(zstore, row.job_id, 1)
    now = zstore.now_ms()
    press("run_now")
    due = zstore.get(row.job_id).due_ms
    assert due is not None and now <= due <= zstore.now_ms()
    html = press("reset_failures")
    assert zstore.get(row.job_id).state.consecutive_failures == 0
    assert "Reset the failures of 1 job" in html


def test_a_button_on_a_job_missing_from_redis_saves_and_the_outbox_creates_it_paused(
        admin_client: Client, zstore: Store) -> None:
    row = ZSchedJob.objects.create(url="http://127.0.0.1:1/db-only", interval_s=60)
    response = admin_client.post(reverse("admin:zsched_zschedjob_pause", args=[row.pk]),
                                 follow=True)
    assert "not in Redis yet" in messages_of(response)[1]
    assert not ZSchedJob.objects.get(pk=row.pk).enabled
    assert outbox.sweep().pushed == 1
    assert zstore.get(row.job_id).paused
    assert not ZSchedOutbox.objects.exists()


def test_recent_runs_inline_shows_the_drained_history(admin_client: Client, zstore: Store) -> None:
    row = bulk_jobs(zstore, 1)[0]
    for n in range(22):
        zstore.run_now(row.job_id)
        claimed = next(c for c in zstore.claim().jobs if c.job.id == row.job_id)
        outcome = "error" if n == 21 else "complete"
        zstore.settle(row.job_id, claimed.occurrence, claimed.attempt, outcome,
                      error="HTTP 502 from upstream" if outcome == "error" else "",
                      event={"task_id": f"task-{n}", "duration_ms": 100 + n, "wait_ms": 3})
    report = drain()
    assert report.created == 22

    response = admin_client.get(reverse(CHANGE, args=[row.pk]))
    formset = response.context["inline_admin_formsets"][0].formset
    runs = [form.instance for form in formset.forms]
    assert len(runs) == 20  # the newest 20, newest first
    assert [r.task_id for r in runs[:2]] == ["task-21", "task-20"]
    html = response.content.decode()
    assert "HTTP 502 from upstream" in html and "121 ms" in html
    assert "task-1<" not in html and "task-0<" not in html
    # The drain refreshed the mirror too (an error that will be retried is no run yet).
    row.refresh_from_db()
    assert (row.run_count, row.consecutive_failures, row.last_status) == (21, 1, "retrying")
    assert "21 runs, 1 failure, 1 in a row" in html


def test_redis_down_shows_on_the_page_and_a_pause_waits_in_the_outbox(
        admin_client: Client, zstore: Store, settings: Any) -> None:
    row = bulk_jobs(zstore, 1)[0]
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"  # refuses at once
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200 and "Redis unavailable" in response.content.decode()
    response = action(admin_client, "pause_jobs", [row.job_id])
    assert "not in Redis yet" in messages_of(response)[1]
    assert not ZSchedJob.objects.get(pk=row.pk).enabled
    page = admin_client.get(reverse(CHANGE, args=[row.pk]))
    assert page.status_code == 200 and "Redis unavailable" in page.content.decode()
    # Run now changes Redis state only: with Redis down it changes nothing.
    response = action(admin_client, "run_now_jobs", [row.job_id])
    assert messages_of(response)[0].startswith("Nothing changed: Redis unreachable")
    # Redis is back: the sweeper delivers the pause.
    settings.CELERY_ZSCHED_REDIS_URL = zstore.settings.redis_url
    assert outbox.sweep().pushed == 1
    assert zstore.get(row.job_id).paused


def test_reconcile_after_pause_and_resume_actions_keeps_their_effect(
        admin_client: Client, zstore: Store) -> None:
    # The actions change the paused set and the row, not the definition JSON in
    # Redis; a later reconcile rewrites those definitions and must undo nothing.
    rows = bulk_jobs(zstore, 4)
    ids = [r.job_id for r in rows]
    action(admin_client, "pause_jobs", ids[:2])
    action(admin_client, "resume_jobs", ids[:1])
    before = zstore.get_many(ids)
    report = reconcile()
    assert report.missing == 0 and not report.invalid
    after = zstore.get_many(ids)
    assert [(i.paused, i.due_ms) for i in after if i] == [(i.paused, i.due_ms) for i in before if i]
    assert [i.paused for i in after if i] == [False, True, False, False]
