"""Issue 12 in the admin, against a real (throwaway) Redis: the timing in plain
words as it is typed, the time-zone list, clock times with their zone, the
changelist's next-run sort, dead-lettered and queue filters, and the run lists.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from celery_zsched.contrib.django import conf, next_run_order
from celery_zsched.contrib.django.admin_times import zone_label
from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.job_filters import DEFAULT_QUEUE, QueueFilter
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.store import Store
from tests.dead_letters import kill
from tests.django.test_admin import bulk_jobs, changelist_ids, form_data

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:zsched_zschedjob_changelist"
ADD = "admin:zsched_zschedjob_add"
CHANGE = "admin:zsched_zschedjob_change"
PREVIEW = "admin:zsched_zschedjob_preview"
RUNS = "admin:zsched_zschedrun_changelist"


def abbrev(zone: str, at: datetime | None = None) -> str:
    """The zone's abbreviation now (CET or CEST: the tests run in any season)."""
    return (at or timezone.now()).astimezone(ZoneInfo(zone)).strftime("%Z")


def cells(html: str, field: str) -> list[str]:
    """The text of every ``field-<field>`` cell (tags dropped, spaces squeezed)."""
    found = re.findall(rf'<t[dh] class="field-{field}">(.*?)</t[dh]>', html, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in found]


def html_of(response: Any) -> str:
    assert response.status_code == 200
    return str(response.content.decode())


def settle_once(store: Store, job_id: str, *, outcome: str = "complete",
                event: dict[str, Any] | None = None) -> None:
    """One run of ``job_id``, as a worker reports it (rows saved in a test transaction
    never reach Redis on commit: the job is stored here first)."""
    row = ZSchedJob.objects.filter(job_id=job_id).first()
    if row is not None:
        store.upsert(row.to_job())
    store.run_now(job_id)
    claimed = next(c for c in store.claim().jobs if c.job.id == job_id)
    store.settle(job_id, claimed.occurrence, claimed.attempt, outcome, event=event or {})


# ------------------------------------------------------- words as you type
def test_the_preview_endpoint_returns_the_timing_in_plain_words(admin_client: Client) -> None:
    def words(**query: str) -> str:
        response = admin_client.get(reverse(PREVIEW), query)
        assert response.status_code == 200, response.content
        return str(response.json()["words"])

    assert words(cron="*/15 * * * *", timezone="America/New_York") == \
        "Every 15 minutes (America/New_York time)"
    assert words(cron="0 9 * * 1", day_rule="and") == \
        "At 09:00, only on Monday (Europe/Berlin time), only on days matching both day fields"
    assert words(interval_s="7200", jitter_s="30") == \
        "Every 2 hours, plus up to 30 s of random jitter"
    assert words() == "Every 5 minutes"  # no timing: the default interval (300 s)
    # A naive time is read as the form reads it: in TIME_ZONE, not the job's zone.
    assert words(run_at="2031-01-15T09:30:00", timezone="America/New_York") == \
        "Once, at 2031-01-15 03:30:00 EST (America/New_York)"


@pytest.mark.parametrize(("query", "field", "part"), [
    ({"cron": "61 * * * *"}, "cron", "'61' is not in 0-59 for minutes"),
    ({"cron": "0 25 * * *"}, "cron", "'25' is not in 0-23 for hours"),
    ({"cron": "0 12 * * *", "timezone": "Mars/Base"}, "timezone", "unknown IANA time zone"),
])
def test_a_bad_timing_answers_the_field_and_the_bad_part(
        admin_client: Client, query: dict[str, str], field: str, part: str) -> None:
    response = admin_client.get(reverse(PREVIEW), query)
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == [field] and part in errors[field][0]


def test_the_add_and_change_forms_hold_the_live_words(admin_client: Client,
                                                      make_row: Callable[..., ZSchedJob]) -> None:
    add = html_of(admin_client.get(reverse(ADD)))
    assert '<span id="zsched-words">' in add and 'id="zsched-next-fires"' in add
    assert "zsched/job_preview.js" in add
    row = make_row(cron="30 8 * * 1-5", interval_s=None, timezone="Europe/Berlin")
    change = html_of(admin_client.get(reverse(CHANGE, args=[row.pk])))
    assert re.search(r'<span id="zsched-words">At 08:30, Monday through Friday '
                     r"\(Europe/Berlin time\)</span>", change)


# ------------------------------------------------------------ zone list
def test_the_time_zone_box_suggests_every_iana_zone(admin_client: Client) -> None:
    html = html_of(admin_client.get(reverse(ADD)))
    box = re.search(r'<input[^>]*name="timezone"[^>]*>', html)
    assert box is not None and 'list="zsched-timezones"' in box.group(0)
    datalist = re.search(r'<datalist id="zsched-timezones">(.*?)</datalist>', html, re.S)
    assert datalist is not None
    zones = re.findall(r'<option value="([^"]+)">', datalist.group(1))
    assert {"Europe/Berlin", "America/New_York", "UTC", "Asia/Kathmandu"} <= set(zones)
    assert zones == sorted(zones) and len(zones) > 400


def test_an_unknown_zone_is_an_error_on_the_time_zone_field(admin_client: Client) -> None:
    response = admin_client.post(reverse(ADD), form_data(
        url="https://a.example/x", cron="0 12 * * *", timezone="Europe/Berlim"))
    assert response.status_code == 200  # the form again, not a redirect
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["timezone"] and "unknown IANA time zone" in errors["timezone"][0]
    assert not ZSchedJob.objects.exists()


# --------------------------------------------------------- zoned clock times
def test_changelist_times_carry_their_zone(admin_client: Client, zstore: Store) -> None:
    rows = bulk_jobs(zstore, 2)
    once_at = timezone.now() + timedelta(days=3)
    once = ZSchedJob.objects.create(url="https://a.example/once", run_at=once_at)
    zstore.upsert(once.to_job())
    html = html_of(admin_client.get(reverse(CHANGELIST)))
    zone = abbrev("Europe/Berlin")
    # Each next run: "in 4 min" over a clock time with its zone.
    for row in rows:
        due = zstore.get(row.job_id).due_ms
        assert due is not None
        clock = datetime.fromtimestamp(due / 1000, ZoneInfo("Europe/Berlin"))
        assert f"{clock:%H:%M:%S} {zone}" in html or f"{clock:%Y-%m-%d %H:%M:%S} {zone}" in html
    local = timezone.localtime(once_at)
    assert f"{local:%Y-%m-%d %H:%M} {local:%Z}" in html  # the one-off's schedule column


def test_the_job_page_shows_its_zone_beside_the_admins_and_zoned_times(
        admin_client: Client, zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(cron="0 9 * * *", interval_s=None, timezone="America/New_York")
    settle_once(zstore, row.job_id)
    drain()
    html = html_of(admin_client.get(reverse(CHANGE, args=[row.pk])))
    ny, berlin = abbrev("America/New_York"), abbrev("Europe/Berlin")
    zones = re.search(r'<div class="readonly">(job: America/New_York[^<]*)</div>', html)
    assert zones is not None
    assert re.fullmatch(rf"job: America/New_York \({ny}, UTC-0[45]:00\) · times on this "
                        rf"page: Europe/Berlin \({berlin}, UTC\+0[12]:00\) · Redis keeps UTC",
                        zones.group(1).replace("&#x27;", "'")), zones.group(1)
    # The next run in the admin's zone, then on the job's own clock.
    due = zstore.get(row.job_id).due_ms
    assert due is not None
    own = datetime.fromtimestamp(due / 1000, ZoneInfo("America/New_York"))
    assert f"{own:%Y-%m-%d} 09:00:00 {own:%Z} (America/New_York)" in html
    # Counters and stamps: to the second, with the zone.
    row.refresh_from_db()
    assert row.last_run_at is not None
    for name, value in (("last_run", row.last_run_at), ("created", row.created_at),
                        ("updated", row.updated_at)):
        text = timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
        assert re.search(rf'field-{name}">.*?<div class="readonly">{text}</div>', html, re.S), \
            name


@pytest.mark.parametrize(("zone", "label"), [
    ("America/New_York", "America/New_York (EST, UTC-05:00)"),
    ("Asia/Kathmandu", "Asia/Kathmandu (UTC+05:45)"),  # no letter abbreviation: "+0545"
    ("America/St_Johns", "America/St_Johns (NST, UTC-03:30)"),
    ("Europe", "Europe (unknown zone)"),  # a folder of the database: OSError inside
    ("x" * 300, f"{'x' * 300} (unknown zone)"),
    ("../etc", "../etc (unknown zone)"),
])
def test_zone_labels_in_winter(zone: str, label: str) -> None:
    assert zone_label(zone, datetime(2027, 1, 15, 12, tzinfo=ZoneInfo("UTC"))) == label


def test_date_time_inputs_say_which_zone_they_are_typed_in(admin_client: Client) -> None:
    html = html_of(admin_client.get(reverse(ADD)))
    zone = abbrev("Europe/Berlin")
    for name in ("run_at", "start_at", "end_at"):
        help_text = re.search(rf'name="{name}_1".*?<div class="help"[^>]*>\s*<div>(.*?)</div>',
                              html, re.S)
        assert help_text is not None, name
        assert f"Typed in Europe/Berlin ({zone}, UTC+0" in help_text.group(1)


# ------------------------------------------------------------- changelist
def _sort_column(client: Client) -> int:
    cl = client.get(reverse(CHANGELIST)).context["cl"]
    return int(cl.list_display.index("next_run"))


@pytest.mark.parametrize("way", ["direct", "walk"])
def test_next_run_sorts_from_the_redis_schedule(admin_client: Client, zstore: Store,
                                                monkeypatch: pytest.MonkeyPatch,
                                                way: str) -> None:
    if way == "walk":  # as for a long list: walk the schedule, 40 ids per SQL query
        monkeypatch.setattr(next_run_order, "DIRECT_MAX", 0)
        monkeypatch.setattr(next_run_order, "CHUNK", 40)
    rows = bulk_jobs(zstore, 150)  # staggered: 150 distinct due times, over two pages
    by_id = {row.job_id: row for row in rows}
    paused = [rows[5].job_id, rows[77].job_id]
    zstore.pause(*paused)
    due = {job_id: info.due_ms for job_id, info in
           zip(by_id, zstore.get_many(list(by_id)), strict=True) if info is not None}
    scheduled = sorted((ms, job_id) for job_id, ms in due.items() if ms is not None)
    earliest = [job_id for _, job_id in scheduled]
    assert len(earliest) == 148

    column = _sort_column(admin_client)
    header = html_of(admin_client.get(reverse(CHANGELIST)))
    # The column header is a sort link, and the default list is not sorted by it.
    th = re.search(r'<th scope="col" class="([^"]*column-next_run[^"]*)">(.*?)</th>', header,
                   re.S)
    assert th is not None and "sortable" in th.group(1) and "sorted" not in th.group(1)
    assert re.search(rf'href="\?o={column}(\.\d+)*"', th.group(2))

    page1 = changelist_ids(admin_client.get(reverse(CHANGELIST), {"o": str(column)}))
    page2 = changelist_ids(admin_client.get(reverse(CHANGELIST), {"o": str(column), "p": "2"}))
    # Unscheduled jobs (paused here) last, by name.
    assert page1 + page2 == [*earliest, *sorted(paused, key=lambda i: by_id[i].name)]

    latest = changelist_ids(admin_client.get(reverse(CHANGELIST), {"o": f"-{column}"}))
    assert latest == earliest[::-1][:100]

    # With a search: only matching rows, still in due order.
    found = changelist_ids(admin_client.get(reverse(CHANGELIST),
                                            {"o": str(column), "q": '"feed 001"'}))
    expect = [i for i in earliest if "feed 001" in by_id[i].name]
    assert len(expect) == 50 and found == expect  # feed 00100 to feed 00149


def test_a_walk_that_reads_too_much_of_the_schedule_stops_and_says_so(
        admin_client: Client, zstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(next_run_order, "DIRECT_MAX", 0)
    monkeypatch.setattr(next_run_order, "CHUNK", 10)
    monkeypatch.setattr(next_run_order, "WALK_MAX", 30)
    rows = bulk_jobs(zstore, 60)
    names = {row.job_id: row.name for row in rows}
    by_due = [info.job.id for info in sorted(
        (i for i in zstore.get_many(list(names)) if i is not None),
        key=lambda i: (i.due_ms or 0, i.job.id))]
    column = _sort_column(admin_client)

    def search(job_id: str) -> tuple[list[str], list[str]]:
        response = admin_client.get(reverse(CHANGELIST), {"o": str(column), "q": names[job_id]})
        return changelist_ids(response), [str(m) for m in response.context["messages"]]

    stopped = ("Sorting by next run stopped after 30 scheduled jobs, before this page was "
               "full: narrow the filters.")
    assert search(by_due[0]) == ([by_due[0]], [])  # found in the first chunk
    assert search(by_due[-1]) == ([], [stopped])   # 60th of 60: past the limit
    zstore.pause(by_due[0])  # out of the schedule: after a stopped walk, not reached
    assert search(by_due[0]) == ([], [stopped])


@pytest.fixture
def dying(settings: Any) -> Store:
    """The Django store with a lease that runs out at once, and one crash to die."""
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    return conf.get_store()


def test_the_dead_lettered_filter_lists_only_dead_jobs(
        admin_client: Client, dying: Store, make_row: Callable[..., ZSchedJob]) -> None:
    rows = [make_row(n, name=f"page {n}", retry_max=0) for n in range(5)]
    kill(dying, [rows[1].to_job(), rows[3].to_job()])
    dead = changelist_ids(admin_client.get(reverse(CHANGELIST), {"dead": "yes"}))
    alive = changelist_ids(admin_client.get(reverse(CHANGELIST), {"dead": "no"}))
    assert sorted(dead) == sorted([rows[1].job_id, rows[3].job_id])
    assert sorted(alive) == sorted(r.job_id for r in (rows[0], rows[2], rows[4]))
    html = html_of(admin_client.get(reverse(CHANGELIST)))
    assert "By dead-lettered" in html and "?dead=yes" in html


def test_the_queue_filter_has_no_blank_choice(admin_client: Client, zstore: Store) -> None:
    rows = bulk_jobs(zstore, 4)
    ZSchedJob.objects.filter(pk=rows[0].pk).update(queue="slow")
    ZSchedJob.objects.filter(pk=rows[1].pk).update(queue="fast")
    cl = admin_client.get(reverse(CHANGELIST)).context["cl"]
    spec = next(f for f in cl.filter_specs if isinstance(f, QueueFilter))
    assert spec.lookup_choices == [(DEFAULT_QUEUE, "Default queue (none set)"),
                                   ("fast", "fast"), ("slow", "slow")]
    assert all(value and label.strip() for value, label in spec.lookup_choices)
    default = changelist_ids(admin_client.get(reverse(CHANGELIST), {"queue": DEFAULT_QUEUE}))
    assert sorted(default) == sorted(r.job_id for r in rows[2:])


# ------------------------------------------------------------------ runs
def _run_with_timings(store: Store, row: ZSchedJob) -> None:
    due = 1_900_000_000_000
    settle_once(store, row.job_id, event={
        "task_id": "task-1", "due_ms": due, "promoted_ms": due + 1_250,
        "started_ms": due + 4_750, "lateness_ms": 1_250, "wait_ms": 3_500,
        "duration_ms": 420})
    drain()


def test_the_runs_list_shows_job_names_zoned_seconds_wait_and_lateness(
        admin_client: Client, zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(name="Tagesschau feed")
    _run_with_timings(zstore, row)
    run = ZSchedRun.objects.get()
    html = html_of(admin_client.get(reverse(RUNS)))
    assert cells(html, "job_name") == [f"Tagesschau feed {row.job_id}"]
    assert run.due_at is not None
    assert cells(html, "finished") == [
        timezone.localtime(run.finished_at).strftime("%Y-%m-%d %H:%M:%S %Z")]
    assert cells(html, "scheduled") == [
        timezone.localtime(run.due_at).strftime("%Y-%m-%d %H:%M:%S %Z")]
    # wait = picked up - scheduled (4.75 s); lateness = published - scheduled (1.25 s).
    assert cells(html, "wait") == ["4750 ms"] and cells(html, "lateness") == ["1250 ms"]
    assert "Wait: picked up minus scheduled" in html  # the columns explained
    assert cells(html, "status_badge") == ["Complete"]
    ZSchedRun.objects.create(job_id=row.job_id, occurrence=1, attempt=3, status="retrying",
                             finished_at=timezone.now(), stream_id="1-1")
    retry = cells(html_of(admin_client.get(reverse(RUNS))), "status_badge")
    assert retry == ["Error, retrying attempt 3", "Complete"]


def test_a_run_of_a_job_without_a_row_shows_its_id(admin_client: Client, zstore: Store) -> None:
    job = bulk_jobs(zstore, 1)[0]
    ZSchedJob.objects.filter(pk=job.pk).delete()  # the job went; Redis still runs it
    settle_once(zstore, job.job_id)
    drain()
    html = html_of(admin_client.get(reverse(RUNS)))
    assert cells(html, "job_name") == [job.job_id]


def test_the_inline_runs_have_the_columns_and_no_label_line(
        admin_client: Client, zstore: Store, make_row: Callable[..., ZSchedJob]) -> None:
    row = make_row(name="Heise news")
    _run_with_timings(zstore, row)
    run = ZSchedRun.objects.get()
    html = html_of(admin_client.get(reverse(CHANGE, args=[row.pk])))
    inline = html[html.index('id="runs-group"'):]
    following = inline.find('class="js-inline-admin-formset')  # the next inline (changes)
    inline = inline if following == -1 else inline[:following]
    assert str(run) not in inline and "ZSchedRun object" not in inline
    assert 'class="original"' not in inline
    headers = re.findall(r'<th class="column-(\w+)">', inline)
    assert headers == ["finished", "status_badge", "attempt", "scheduled", "wait", "lateness",
                       "duration", "short_error", "task_id"]
    assert cells(inline, "finished") == [
        timezone.localtime(run.finished_at).strftime("%Y-%m-%d %H:%M:%S %Z")]
    assert cells(inline, "wait") == ["4750 ms"] and cells(inline, "lateness") == ["1250 ms"]
    assert cells(inline, "task_id") == ["task-1"]
    assert "Wait: picked up minus scheduled" in inline


def test_with_redis_down_the_sort_and_the_dead_filter_say_so(
        admin_client: Client, zstore: Store, settings: Any) -> None:
    rows = bulk_jobs(zstore, 3)
    column = _sort_column(admin_client)
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"  # refuses at once
    response = admin_client.get(reverse(CHANGELIST), {"o": str(column)})
    assert response.status_code == 200
    assert any(str(m).startswith("Cannot sort by next run: Redis unreachable")
               for m in response.context["messages"])
    assert sorted(changelist_ids(response)) == sorted(r.job_id for r in rows)  # unsorted
    response = admin_client.get(reverse(CHANGELIST), {"dead": "yes"})
    assert response.status_code == 200 and changelist_ids(response) == []
    assert any(str(m).startswith("Cannot filter by dead letters: Redis unreachable")
               for m in response.context["messages"])


def test_saving_the_job_page_posts_the_inline_back_and_changes_no_run(
        admin_client: Client, zstore: Store, make_row: Callable[..., ZSchedJob],
        django_capture_on_commit_callbacks: Any) -> None:
    row = make_row(name="Heise news")
    for n in range(2):
        settle_once(zstore, row.job_id, event={"task_id": f"task-{n}", "duration_ms": 5})
    drain()
    before = list(ZSchedRun.objects.order_by("id").values())
    html = html_of(admin_client.get(reverse(CHANGE, args=[row.pk])))
    hidden = dict(re.findall(r'<input type="hidden" name="(runs-[^"]+)" value="([^"]*)"', html))
    # What Django's own tabular template posts: the management form, each row's id and job.
    assert set(hidden) == {"runs-TOTAL_FORMS", "runs-INITIAL_FORMS", "runs-MIN_NUM_FORMS",
                           "runs-MAX_NUM_FORMS", "runs-0-id", "runs-0-job", "runs-1-id",
                           "runs-1-job"}
    assert hidden["runs-INITIAL_FORMS"] == "2"
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(reverse(CHANGE, args=[row.pk]), form_data(
            **hidden, name="Heise newsticker", url=row.url, interval_s="60"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert ZSchedJob.objects.get(pk=row.pk).name == "Heise newsticker"
    assert list(ZSchedRun.objects.order_by("id").values()) == before
