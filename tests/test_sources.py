"""``celery zsched import --from redbeat``: redbeat's entries become jobs that keep its timeline.

Entries are written by redbeat's ``RedBeatSchedulerEntry.save()`` on the
throwaway Redis and loaded back with its ``from_key``; the expected fires come
from redbeat's ``is_due`` / ``due_at`` and its schedule objects (see
tests/source_fires.py).
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.celery import celery
from celery.schedules import crontab, schedule
from click.testing import CliRunner, Result

from celery_zsched.core.timing import dt_to_ms, ms_to_dt
from celery_zsched.services.appstore import forget_app
from celery_zsched.services.beat_entries import static_job_id
from celery_zsched.services.sources import ceil_ms, first_due_ms, read_redbeat
from celery_zsched.store import Store
from tests.helpers import store_snapshot
from tests.source_fires import (
    assert_due_flips_at,
    check_chain,
    frozen,
    load_redbeat_entry,
    save_redbeat_entry,
    source_next,
)

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.cli_app"
#: tests.cli_app's zone: redbeat runs crontabs in its app's zone, and so does the import.
APP_TZ = "Europe/Berlin"
CHAIN_START = datetime(2026, 3, 1, 0, 0, 7, tzinfo=timezone.utc)
UNREACHABLE = "redis://127.0.0.1:1/0"

Run = Callable[..., Result]


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The zsched key prefix of the CLI app, through the ``ZSCHED_*`` environment."""
    value = "{src" + uuid.uuid4().hex[:8] + "}:"
    monkeypatch.setenv("ZSCHED_REDIS_URL", redis_url)
    monkeypatch.setenv("ZSCHED_KEY_PREFIX", value)
    monkeypatch.syspath_prepend(str(ROOT))
    app = importlib.import_module(APP).app
    forget_app(app)
    yield value
    forget_app(app)


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str) -> Store:
    """The store the CLI writes to."""
    return make_store(timezone=APP_TZ, key_prefix=prefix)


@pytest.fixture
def run(prefix: str) -> Run:
    """``celery -A tests.cli_app zsched ARGS``, in-process."""
    def invoke(*args: str) -> Result:
        return CliRunner().invoke(celery, ["-A", APP, "zsched", *args], catch_exceptions=False)
    return invoke


def _redbeat_app(url: str) -> Celery:
    app = Celery("redbeat_src", set_as_current=False)
    app.conf.update(redbeat_redis_url=url, timezone=APP_TZ,
                    redbeat_key_prefix=f"rb{uuid.uuid4().hex[:6]}:")
    return app


@pytest.fixture
def redbeat(redis_url: str, rclient: Any) -> Celery:
    """An app whose redbeat keys are on the throwaway server (flushed after the test)."""
    return _redbeat_app(redis_url)


def _entries(app: Celery, now: datetime) -> dict[str, datetime | None]:
    """Entries of every kind redbeat can hold (but rrule); name -> last_run_at."""
    minute = timedelta(minutes=1)
    specs: list[tuple[str, Any, datetime | None, dict[str, Any]]] = [
        ("sync", timedelta(minutes=5), now - 2 * minute,
         {"options": {"queue": "sync", "routing_key": "sync.x", "priority": 3,
                      "expires": 120}, "args": ["a"], "kwargs": {"n": 1}}),
        ("poll", schedule(timedelta(seconds=30)), now - 10 * minute, {}),
        ("fresh", timedelta(minutes=1), None, {}),
        ("quarter hours", crontab(minute="*/15"), now - minute, {}),
        ("mornings", crontab(minute=30, hour=9, day_of_week="mon-fri"), now - 60 * minute, {}),
        ("1st/15th mondays", crontab(minute=0, hour=4, day_of_month="1,15", day_of_week=1),
         now - 60 * minute, {}),
        ("sundays", crontab(minute=0, hour=0, day_of_week="sunday"), now - 60 * minute, {}),
        ("six-hourly, never ran", crontab(minute=0, hour="*/6"), None, {}),
        ("paused", timedelta(minutes=2), now - minute, {"enabled": False}),
        ("extras", timedelta(hours=1), now - minute,
         {"options": {"exchange": "fanout", "headers": {"h": 1},
                      "expires": now + timedelta(days=3)}}),
        ("hourly, relative", schedule(timedelta(hours=1), relative=True), now - minute, {}),
    ]
    for name, sched, last, fields in specs:
        save_redbeat_entry(app, name, sched, last_run_at=last, **fields)
    return {name: last for name, _, last, _ in specs}


def _loaded(app: Celery, name: str) -> Any:
    entry = load_redbeat_entry(app, name)
    # redbeat's beat runs with its app current: crontabs take its zone.
    entry.schedule.app = app
    return entry


def _check_first_fire(app: Celery, name: str, store: Store, before: int, after: int) -> int:
    """The job's first run is redbeat's next fire; returns the fires checked."""
    entry, info = _loaded(app, name), store.get(static_job_id(name))
    if not entry.enabled:
        assert (info.paused, info.due_ms) == (True, None)
        return 0
    assert info.due_ms is not None
    last = entry.last_run_at
    if last is None:  # never ran: redbeat's due_at is now, and so is ours
        assert before <= info.due_ms <= after
        assert abs(ceil_ms(entry.due_at) - info.due_ms) < 5_000
        return 1
    nxt = source_next(entry.schedule, last, ms_to_dt(before))
    if getattr(entry.schedule, "relative", False):
        # Celery rounds a relative interval's fire down to its unit (here the
        # hour); the job runs at last + every: later, never earlier (README).
        assert ceil_ms(nxt) <= info.due_ms < ceil_ms(nxt + timedelta(hours=1))
        return 0
    if ceil_ms(nxt) > after:
        assert info.due_ms == ceil_ms(nxt), (name, ms_to_dt(info.due_ms), nxt)
        assert_due_flips_at(entry.schedule, last, info.due_ms)
    else:  # overdue: redbeat's due_at is now, and it is due
        assert before <= info.due_ms <= after, name
        assert frozen(entry.schedule, ms_to_dt(info.due_ms)).is_due(last)[0], name
    return 1


def test_redbeat_entries_move_with_the_fires_redbeat_would_make(
        redbeat: Celery, run: Run, zstore: Store) -> None:
    names = _entries(redbeat, datetime.now(timezone.utc))
    before = zstore.now_ms()
    result = run("import", "--from", "redbeat", "--redbeat-prefix",
                 redbeat.conf.redbeat_key_prefix)
    after = zstore.now_ms()
    assert result.exit_code == 0, result.output

    assert zstore.stats()["jobs"] == len(names)
    first = sum(_check_first_fire(redbeat, name, zstore, before, after) for name in names)
    # The relative interval is left out: Celery rounds its fires, zsched does not.
    later = sum(check_chain(zstore.get(static_job_id(name)).job, _loaded(redbeat, name).schedule,
                            CHAIN_START) for name in names if name != "hourly, relative")
    print(f"redbeat: {len(names)} entries moved, {first} first fires and {later} later "
          "fires checked")
    assert (first, later) == (9, 40 * 10)
    assert f"create: {len(names)}, update: 0, unchanged: 0" in result.output


def test_fields_map_and_what_is_lost_is_listed(redbeat: Celery, run: Run, zstore: Store) -> None:
    now = datetime.now(timezone.utc)
    _entries(redbeat, now)
    out = run("import", "--from", "redbeat", "--redbeat-prefix",
              redbeat.conf.redbeat_key_prefix).output
    sync = zstore.get("sync").job
    assert (sync.task, sync.interval_s, sync.args, sync.kwargs) == (
        "proj.tasks.work", 300.0, ["a"], {"n": 1})
    assert (sync.queue, sync.routing_key, sync.priority, sync.expires_s) == (
        "sync", "sync.x", 3, 120)
    mondays = zstore.get(static_job_id("1st/15th mondays")).job
    assert (mondays.cron, mondays.timezone) == ("0 4 1,15 * 1", APP_TZ)
    assert mondays.day_rule == "and"
    assert zstore.get("sundays").job.cron == "0 0 * * 0"
    assert zstore.get("paused").paused
    assert zstore.get("extras").job.end_at == dt_to_ms(now + timedelta(days=3))
    for lost in ("options.exchange='fanout'", "options.headers={'h': 1}"):
        assert f"'extras' (extras): {lost}" in out
    assert "schedule.relative=True" in out


def test_a_second_run_changes_nothing(redbeat: Celery, run: Run, zstore: Store) -> None:
    _entries(redbeat, datetime.now(timezone.utc))
    args = ("import", "--from", "redbeat", "--redbeat-prefix", redbeat.conf.redbeat_key_prefix)
    run(*args)
    before = store_snapshot(zstore)

    result = run(*args)

    assert result.exit_code == 0, result.output
    assert store_snapshot(zstore) == before
    assert "create: 0, update: 0, unchanged: 11" in result.output


def test_dry_run_writes_nothing(redbeat: Celery, run: Run, zstore: Store) -> None:
    _entries(redbeat, datetime.now(timezone.utc))
    before = store_snapshot(zstore)

    result = run("import", "--from", "redbeat", "--dry-run", "--redbeat-prefix",
                 redbeat.conf.redbeat_key_prefix)

    assert result.exit_code == 0, result.output
    assert store_snapshot(zstore) == before
    assert "would create: 11, would update: 0, unchanged: 0" in result.output
    assert "would create 'sync' -> sync: proj.tasks.work, every 300s, first run " in result.output


def test_an_rrule_entry_is_a_row_error_and_nothing_is_written(
        redbeat: Celery, run: Run, zstore: Store) -> None:
    from redbeat.schedules import rrule

    save_redbeat_entry(redbeat, "ok", timedelta(minutes=1), last_run_at=None)
    save_redbeat_entry(redbeat, "weekly rrule", rrule("WEEKLY", dtstart=datetime.now(
        timezone.utc)), last_run_at=None)
    before = store_snapshot(zstore)
    args = ("import", "--from", "redbeat", "--redbeat-prefix", redbeat.conf.redbeat_key_prefix)

    result = run(*args)

    assert result.exit_code == 65, result.output
    key = redbeat.conf.redbeat_key_prefix + "weekly rrule"
    assert (f"redbeat entry {key!r}: schedule: only interval and crontab schedules can be "
            "moved to zsched (got 'rrule')") in result.output
    assert store_snapshot(zstore) == before

    result = run(*args, "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert zstore.stats()["jobs"] == 1 and zstore.get("ok")


def test_redbeat_on_another_server_is_read_with_redbeat_url(
        redis_url: str, rclient: Any, run: Run, zstore: Store) -> None:
    other_url = redis_url.rsplit("/", 1)[0] + "/1"  # db 1 stands in for another server
    app = _redbeat_app(other_url)
    save_redbeat_entry(app, "elsewhere", timedelta(minutes=1), last_run_at=None)
    args = ("import", "--from", "redbeat", "--redbeat-prefix", app.conf.redbeat_key_prefix)

    assert "movable" in run(*args).output and zstore.stats()["jobs"] == 0
    result = run(*args, "--redbeat-url", other_url)

    assert result.exit_code == 0, result.output
    assert zstore.get("elsewhere").job.interval_s == 60.0


def test_an_unreachable_redbeat_url_fails_cleanly(run: Run, zstore: Store) -> None:
    before = store_snapshot(zstore)
    result = run("import", "--from", "redbeat", "--redbeat-url", UNREACHABLE)
    assert result.exit_code == 69, result.output
    assert "cannot read redbeat's entries" in result.output
    assert store_snapshot(zstore) == before


def test_from_and_file_are_exclusive_and_django_celery_beat_points_to_manage_py(
        run: Run, tmp_path: Path) -> None:
    assert run("import").exit_code == 2
    assert run("import", "--from", "redbeat", "-f", str(tmp_path / "x.json")).exit_code == 2
    result = run("import", "--from", "django-celery-beat")
    assert result.exit_code == 2
    assert "manage.py zsched_import --from django-celery-beat" in result.output


# ------------------------------------------------------------ pure helpers
def test_first_due_of_an_ended_job_is_none(store: Store, redbeat: Celery) -> None:
    past = datetime.now(timezone.utc) - timedelta(days=1)
    save_redbeat_entry(redbeat, "ended", timedelta(minutes=1), last_run_at=past,
                       options={"expires": past + timedelta(hours=1)})
    read = read_redbeat(store.client, store.defaults, prefix=redbeat.conf.redbeat_key_prefix)
    assert first_due_ms(read.jobs[0], store.now_ms(), store.settings, store.rng) is None


def test_without_redbeat_installed_the_error_says_what_to_install(
        run: Run, zstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redbeat.schedulers", None)  # import raises ImportError
    result = run("import", "--from", "redbeat")
    assert result.exit_code == 78, result.output
    assert "reading redbeat's entries needs redbeat: pip install celery-redbeat" in result.output
