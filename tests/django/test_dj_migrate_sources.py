"""``zsched_import --from django-celery-beat`` (and ``--from redbeat``) against the real models.

The rows are django-celery-beat's own ``PeriodicTask`` models on the test
database; the expected fires come from their own schedule objects
(``remaining_estimate`` / ``is_due``, see tests/source_fires.py) and from
django-celery-beat's ``ModelEntry``, which decides what a row's last run is.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from io import StringIO
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab
from django.core.management import CommandError, call_command
from django.utils import timezone as dj_timezone
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)
from django_celery_beat.schedulers import ModelEntry

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.core.timing import dt_to_ms, ms_to_dt
from celery_zsched.services.beat_entries import static_job_id
from celery_zsched.services.sources import ceil_ms
from celery_zsched.store import Store
from tests.helpers import store_snapshot
from tests.source_fires import (
    assert_due_flips_at,
    check_chain,
    frozen,
    save_redbeat_entry,
    source_next,
)

pytestmark = pytest.mark.django_db

UTC = timezone.utc
#: Where the chains of later fires start: they cross both 2026 DST changes
#: (New York on March 8, Berlin on March 29).
CHAIN_START = datetime(2026, 3, 1, 0, 0, 7, tzinfo=UTC)


def _run(*args: str) -> str:
    out = StringIO()
    call_command("zsched_import", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _interval(every: int, period: str) -> IntervalSchedule:
    return IntervalSchedule.objects.create(every=every, period=period)


def _crontab(tz: str = "UTC", **fields: str) -> CrontabSchedule:
    return CrontabSchedule.objects.create(timezone=tz, **fields)


def _task(name: str, **fields: Any) -> PeriodicTask:
    last_run_at = fields.pop("last_run_at", None)
    total = fields.pop("total_run_count", 0)
    row = PeriodicTask.objects.create(name=name, task=fields.pop("task", "proj.tasks.work"),
                                      **fields)
    # save() clears last_run_at of a disabled row and never sets the run count:
    # write them as django-celery-beat's scheduler does, with update().
    PeriodicTask.objects.filter(pk=row.pk).update(last_run_at=last_run_at,
                                                  total_run_count=total)
    row.refresh_from_db()
    return row


def _fleet(now: datetime) -> list[PeriodicTask]:
    """One row of every kind django-celery-beat has (but solar), with its options."""
    minute = timedelta(minutes=1)
    return [
        _task("fetch prices", interval=_interval(5, IntervalSchedule.MINUTES),
              last_run_at=now - 2 * minute, queue="prices", routing_key="prices.fetch",
              priority=5, args='["eur"]', kwargs='{"depth": 2}',
              description="Fetch the prices\n   from the API"),
        _task("poll", interval=_interval(30, IntervalSchedule.SECONDS),
              last_run_at=now - 10 * minute),
        _task("hourly, never ran", interval=_interval(1, IntervalSchedule.HOURS)),
        _task("starts tomorrow", interval=_interval(10, IntervalSchedule.MINUTES),
              start_time=now + timedelta(days=1)),
        _task("quarter-hours", crontab=_crontab(minute="*/15"), last_run_at=now - minute),
        _task("berlin mornings", crontab=_crontab("Europe/Berlin", minute="30", hour="9",
                                                  day_of_week="mon-fri"),
              last_run_at=now - 60 * minute),
        # Both day fields: Celery fires on a 1st or 15th that is a Monday (AND).
        _task("ny 1st/15th mondays", crontab=_crontab(
            "America/New_York", minute="0", hour="4", day_of_month="1,15", day_of_week="1"),
            last_run_at=now - 60 * minute),
        _task("tokyo sundays", crontab=_crontab("Asia/Tokyo", minute="0", hour="0",
                                                day_of_week="sun"),
              last_run_at=now - 60 * minute),
        _task("every other month", crontab=_crontab(
            "Australia/Sydney", minute="0,20,40", hour="8-18/2", month_of_year="*/2")),
        _task("noon once", crontab=_crontab(minute="0", hour="12"), one_off=True),
        _task("clocked later", clocked=ClockedSchedule.objects.create(
            clocked_time=now + timedelta(hours=2)), one_off=True),
        _task("clocked done", clocked=ClockedSchedule.objects.create(
            clocked_time=now - timedelta(days=1)), one_off=True, total_run_count=1),
        _task("disabled", interval=_interval(2, IntervalSchedule.MINUTES), enabled=False),
        _task("with extras", interval=_interval(1, IntervalSchedule.DAYS),
              last_run_at=now - 60 * minute, exchange="fanout", headers='{"h": 1}',
              expires=now + timedelta(days=30), total_run_count=7),
        _task("message expiry", interval=_interval(3, IntervalSchedule.HOURS),
              last_run_at=now - 60 * minute, expire_seconds=60),
    ]


def _check_first_fire(row: PeriodicTask, store: Store, before: int, after: int) -> int:
    """The moved job's first run is django-celery-beat's next one; returns fires checked."""
    info = store.get(static_job_id(row.name))
    if not row.enabled or (row.one_off and row.total_run_count):
        assert (info.paused, info.due_ms) == (True, None), row.name
        return 0
    assert info.due_ms is not None
    entry = ModelEntry(row, app=Celery(set_as_current=False))
    last = entry.last_run_at  # ModelEntry's rule for rows that never ran
    nxt = source_next(row.schedule, last, ms_to_dt(before))
    if row.start_time is not None:
        nxt = max(nxt, row.start_time)  # ModelEntry.is_due waits for start_time
    if dt_to_ms(nxt) > after:
        assert info.due_ms == ceil_ms(nxt), (row.name, ms_to_dt(info.due_ms), nxt)
        if row.start_time is None:
            assert_due_flips_at(row.schedule, last, info.due_ms)
    else:  # overdue: both catch up once, now
        assert before <= info.due_ms <= after, row.name
        assert frozen(row.schedule, ms_to_dt(info.due_ms)).is_due(last)[0], row.name
    return 1


def _check_later_fires(row: PeriodicTask, store: Store) -> int:
    if row.clocked_id is not None:
        return 0
    # A job stores whole ms: a chain from start_time starts at its whole ms.
    start = ms_to_dt(ceil_ms(row.start_time)) if row.start_time else CHAIN_START
    return check_chain(store.get(static_job_id(row.name)).job, row.schedule, start)


def test_periodic_tasks_move_with_the_fires_django_celery_beat_would_make(
        zstore: Store) -> None:
    rows = _fleet(dj_timezone.now())
    before = zstore.now_ms()
    out = _run("--from", "django-celery-beat")
    after = zstore.now_ms()

    assert ZSchedJob.objects.count() == len(rows) == zstore.stats()["jobs"]
    first = sum(_check_first_fire(row, zstore, before, after) for row in rows)
    later = sum(_check_later_fires(row, zstore) for row in rows)
    print(f"django-celery-beat: {len(rows)} tasks moved, {first} first fires and "
          f"{later} later fires checked")
    assert (first, later) == (13, 40 * 13)
    assert f"create: {len(rows)}, update: 0, unchanged: 0" in out


def test_fields_map_as_the_readme_says(zstore: Store) -> None:
    now = dj_timezone.now()
    _fleet(now)
    out = _run("--from", "django-celery-beat")
    jobs = {row.job_id: row.to_job() for row in ZSchedJob.objects.all()}
    prices = jobs[static_job_id("fetch prices")]
    assert (prices.name, prices.task, prices.interval_s) == (
        "Fetch the prices from the API", "proj.tasks.work", 300.0)
    assert (prices.queue, prices.routing_key, prices.priority) == ("prices", "prices.fetch", 5)
    assert (prices.args, prices.kwargs) == (["eur"], {"depth": 2})
    assert jobs["poll"].name == "poll"  # no description: the task's name
    berlin = jobs[static_job_id("berlin mornings")]
    assert (berlin.cron, berlin.timezone) == ("30 9 * * 1-5", "Europe/Berlin")
    assert jobs[static_job_id("tokyo sundays")].cron == "0 0 * * 0"
    assert jobs[static_job_id("every other month")].cron == "*/20 8-18/2 * */2 *"
    assert {j.day_rule for j in jobs.values() if j.cron} == {"and"}
    assert jobs[static_job_id("noon once")].max_runs == 1
    clocked = jobs[static_job_id("clocked later")]
    assert (clocked.kind, clocked.max_runs) == ("once", None)
    extras = jobs[static_job_id("with extras")]
    assert extras.end_at == dt_to_ms(now + timedelta(days=30))
    assert jobs[static_job_id("message expiry")].expires_s == 60
    assert jobs[static_job_id("starts tomorrow")].start_at == ceil_ms(now + timedelta(days=1))
    assert not jobs["disabled"].enabled
    for lost in ("exchange='fanout'", "headers={'h': 1}", "total_run_count=7"):
        assert f"'with extras' ({static_job_id('with extras')}): {lost}" in out


def test_a_second_run_changes_nothing(zstore: Store) -> None:
    _fleet(dj_timezone.now())
    _run("--from", "django-celery-beat")
    rows = list(ZSchedJob.objects.order_by("pk").values())
    redis_before = store_snapshot(zstore)

    out = _run("--from", "django-celery-beat")

    assert list(ZSchedJob.objects.order_by("pk").values()) == rows
    assert store_snapshot(zstore) == redis_before
    assert "create: 0, update: 0, unchanged: 15" in out
    assert "database: create 0 row(s), update 0, unchanged 15" in out


def test_a_task_edited_in_django_celery_beat_is_updated_on_the_next_run(zstore: Store) -> None:
    row = _task("poll", interval=_interval(30, IntervalSchedule.SECONDS),
                last_run_at=dj_timezone.now())
    _run("--from", "django-celery-beat")
    row.interval = _interval(2, IntervalSchedule.MINUTES)
    row.save()

    out = _run("--from", "django-celery-beat")

    assert "create: 0, update: 1, unchanged: 0" in out
    assert ZSchedJob.objects.get(job_id="poll").interval_s == 120.0
    info = zstore.get("poll")
    assert info.job.interval_s == 120.0
    assert info.due_ms == ceil_ms(PeriodicTask.objects.get().last_run_at
                                  + timedelta(minutes=2))


def test_dry_run_lists_what_would_change_and_writes_nothing(zstore: Store) -> None:
    _fleet(dj_timezone.now())
    redis_before = store_snapshot(zstore)

    out = _run("--from", "django-celery-beat", "--dry-run")

    assert ZSchedJob.objects.count() == 0
    assert store_snapshot(zstore) == redis_before
    assert "would create: 15, would update: 0, unchanged: 0" in out
    assert "database: would create 15 row(s)" in out
    assert "  would create 'poll' -> poll: proj.tasks.work, every 30s, first run " in out
    assert "would create 'disabled' -> disabled: proj.tasks.work, every 120s, paused" in out


def test_a_solar_task_is_a_row_error_and_nothing_is_written(zstore: Store) -> None:
    _task("poll", interval=_interval(30, IntervalSchedule.SECONDS))
    solar = _task("at sunrise", solar=SolarSchedule.objects.create(
        event="sunrise", latitude=52.52, longitude=13.405))
    redis_before = store_snapshot(zstore)

    with pytest.raises(CommandError) as raised:
        _run("--from", "django-celery-beat")

    message = str(raised.value)
    assert f"PeriodicTask 'at sunrise' (id {solar.pk}): solar: solar schedules cannot be " \
           "moved" in message
    assert "nothing was written" in message
    assert ZSchedJob.objects.count() == 0
    assert store_snapshot(zstore) == redis_before

    out = _run("--from", "django-celery-beat", "--skip-invalid")
    assert list(ZSchedJob.objects.values_list("job_id", flat=True)) == ["poll"]
    assert "error: PeriodicTask 'at sunrise'" in out


def test_bad_json_arguments_name_the_row_and_field(zstore: Store) -> None:
    row = _task("broken", interval=_interval(1, IntervalSchedule.MINUTES), kwargs="{not json")
    with pytest.raises(CommandError, match=rf"PeriodicTask 'broken' \(id {row.pk}\): kwargs: "
                                           r"must be a JSON dict"):
        _run("--from", "django-celery-beat")
    assert zstore.stats()["jobs"] == 0


def test_without_django_celery_beat_in_installed_apps_the_error_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_celery_beat")
    with pytest.raises(CommandError, match="needs it installed and in INSTALLED_APPS"):
        _run("--from", "django-celery-beat")


def test_file_and_from_are_exclusive(tmp_path: Any) -> None:
    with pytest.raises(CommandError, match="either --file or --from"):
        _run()
    with pytest.raises(CommandError, match="either --file or --from"):
        _run("--from", "django-celery-beat", "--file", str(tmp_path / "x.json"))


# ----------------------------------------------------------------- redbeat
@pytest.fixture
def redbeat_app(redis_url: str) -> Celery:
    """A Celery app whose redbeat keys live on the throwaway server, under a prefix of its own."""
    app = Celery("redbeat_src", set_as_current=False)
    app.conf.update(redbeat_redis_url=redis_url, timezone="UTC",
                    redbeat_key_prefix=f"rb{uuid.uuid4().hex[:6]}:")
    return app


def test_redbeat_entries_move_into_the_database_too(
        redbeat_app: Celery, zstore: Store, settings: Any) -> None:
    settings.CELERY_REDBEAT_KEY_PREFIX = redbeat_app.conf.redbeat_key_prefix
    settings.CELERY_TIMEZONE = "Asia/Kolkata"
    save_redbeat_entry(redbeat_app, "report", crontab(minute=0, hour=9), last_run_at=None)
    save_redbeat_entry(redbeat_app, "sync", timedelta(minutes=3),
                       last_run_at=dj_timezone.now())

    out = _run("--from", "redbeat")

    assert set(ZSchedJob.objects.values_list("job_id", flat=True)) == {"report", "sync"}
    report = ZSchedJob.objects.get(job_id="report")
    assert (report.cron, report.timezone) == ("0 9 * * *", "Asia/Kolkata")
    assert "create: 2, update: 0, unchanged: 0" in out
    assert "unchanged: 2" in _run("--from", "redbeat")
