"""The transactional outbox: every change of a job row reaches Redis, in order.

Each writer records its change in the row's transaction; the push after the
commit confirms it; what Redis did not take, the sweeper delivers; a change that
fails by its own fault is retried with backoff, then dead-lettered and shown.
Everything here runs with the default settings (the outbox's and the store's).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.signals import beat_init
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django import conf, outbox
from celery_zsched.contrib.django.api_writer import ModelWriter, row_tags
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.operations import apply_operation
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core.audit import Actor
from celery_zsched.core.job import Job
from celery_zsched.core.state import RuntimeState
from celery_zsched.metrics.exporter import StoreCollector
from celery_zsched.store import Store, audit_log

NOWHERE = "redis://127.0.0.1:1/0"  # refuses at once
OUTBOX = "admin:zsched_zschedoutbox_changelist"


@contextlib.contextmanager
def redis_down(settings: Any) -> Iterator[None]:
    """Point the Django side at a port that refuses, then back (the same store)."""
    url = settings.CELERY_ZSCHED_REDIS_URL
    settings.CELERY_ZSCHED_REDIS_URL = NOWHERE
    try:
        yield
    finally:
        settings.CELERY_ZSCHED_REDIS_URL = url


def version_in_redis(store: Store, job_id: str) -> int | None:
    raw = store.client.hget(store.part_of(job_id).state, job_id)
    return RuntimeState.from_wire(raw).version if raw else None


def sweep_all() -> int:
    """Sweep until nothing is due; the jobs pushed."""
    pushed = 0
    while True:
        report = outbox.sweep()
        pushed += report.pushed
        if not report.full:
            return pushed


def assert_redis_follows_the_rows(store: Store) -> None:
    """Redis holds exactly the rows' definitions and paused states: nothing to reconcile."""
    report = reconcile(dry_run=True)
    assert (report.missing, report.changed, report.deleted) == (0, 0, 0), report.lines()
    for row in ZSchedJob.objects.all():
        info = store.get(row.job_id)
        assert info.paused is not row.enabled, row.job_id
        assert version_in_redis(store, row.job_id) == row.version


def job(n: int, **fields: Any) -> Job:
    return Job.from_dict({"url": f"http://127.0.0.1:1/page/{n}", "interval_s": 60, **fields},
                         conf.get_defaults())


# ------------------------------------------------------------- recording
@pytest.mark.django_db
def test_a_save_records_its_change_in_the_rows_transaction_and_the_push_confirms_it(
        zstore: Store, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
        [entry] = ZSchedOutbox.objects.all()
        assert (entry.job_id, entry.action, row.version) == (row.job_id, "save", entry.pk)
        assert ZSchedJob.objects.get(pk=row.pk).version == entry.pk
        with pytest.raises(RuntimeError), transaction.atomic():
            ZSchedJob.objects.create(url="http://127.0.0.1:1/lost", interval_s=30)
            raise RuntimeError("roll back")
        assert ZSchedOutbox.objects.count() == 1  # the rolled-back change left nothing
    callbacks[0]()
    assert not ZSchedOutbox.objects.exists()
    assert version_in_redis(zstore, row.job_id) == row.version


@pytest.mark.django_db(transaction=True)
def test_every_writer_leaves_its_change_in_the_outbox_when_redis_is_down(
        zstore: Store, settings: Any, tmp_path: Path) -> None:
    """ORM save and delete, queryset delete, pause and resume, zsched_import and the
    REST API's Django writer: with Redis down each change is saved with its entry,
    and one sweep after Redis is back makes Redis follow every row."""
    writer = ModelWriter()
    api = Actor("api", "token:abc")
    rows = [ZSchedJob.objects.create(url=f"http://127.0.0.1:1/page/{n}", interval_s=60)
            for n in range(8)]
    paused = ZSchedJob.objects.create(url="http://127.0.0.1:1/paused", interval_s=60,
                                      enabled=False)
    assert not ZSchedOutbox.objects.exists()  # Redis was up: every push confirmed
    data = tmp_path / "jobs.json"
    data.write_text(json.dumps([{"url": "http://127.0.0.1:1/imported", "interval_s": 90},
                                {"url": rows[7].url, "interval_s": 45}]))
    with redis_down(settings):
        rows[0].interval_s = 120
        rows[0].save()                                           # ORM edit
        rows[1].delete()                                         # ORM delete
        ZSchedJob.objects.filter(pk=rows[2].pk).delete()         # queryset delete
        apply_operation("pause", ZSchedJob.objects.filter(pk__in=[rows[3].pk, rows[4].pk]))
        apply_operation("resume", ZSchedJob.objects.filter(pk=paused.pk))
        edited = job(5, interval_s=33, id=rows[5].job_id)
        assert writer.replace(edited, next(iter(row_tags(rows[5]))), api)  # REST edit
        assert writer.set_paused(rows[6].job_id, True, api)      # REST pause
        assert writer.delete(rows[6].job_id, api) is True       # REST delete
        with pytest.raises(CommandError, match="Redis unreachable"):
            call_command("zsched_import", "--file", str(data), "--update",
                         stdout=io.StringIO(), stderr=io.StringIO())
        with pytest.raises(Exception, match="Redis unreachable"):
            writer.import_jobs([job(9, interval_s=15)], api, "api import", total=1)
    pending = set(ZSchedOutbox.objects.values_list("job_id", flat=True))
    assert pending == {rows[0].job_id, rows[1].job_id, rows[2].job_id, rows[3].job_id,
                       rows[4].job_id, paused.job_id, rows[5].job_id, rows[6].job_id,
                       rows[7].job_id, job(9).id, Job.from_dict(
                           {"url": "http://127.0.0.1:1/imported"}).id}
    assert not ZSchedOutbox.objects.filter(attempts__gt=0).exists()  # an outage never counts
    assert sweep_all() == len(pending)
    assert not ZSchedOutbox.objects.exists()
    assert_redis_follows_the_rows(zstore)
    for gone in (rows[1], rows[2], rows[6]):
        assert zstore.get_many([gone.job_id]) == [None]
    # Each change is in the audit trail once, as made by whoever made it.
    assert [c.action for c in audit_log.history(zstore, rows[5].job_id)][:1] == ["edit"]
    assert audit_log.history(zstore, rows[6].job_id)[0].actor == api


@pytest.mark.django_db(transaction=True)
def test_a_rename_is_a_delete_of_the_old_id_and_a_save_of_the_new_one(zstore: Store,
                                                                      settings: Any) -> None:
    row = ZSchedJob.objects.create(job_id="old", task="t", interval_s=30)
    with redis_down(settings):
        row.job_id = "new"
        row.save()
    assert list(ZSchedOutbox.objects.order_by("id").values_list("job_id", "action")) == [
        ("old", "delete"), ("new", "save")]
    sweep_all()
    assert zstore.get_many(["old"]) == [None] and zstore.get("new").job.task == "t"


# ---------------------------------------------------------------- order
@pytest.mark.django_db
def test_two_saves_whose_pushes_arrive_in_reverse_order_leave_the_newer_definition(
        zstore: Store, django_capture_on_commit_callbacks: Any) -> None:
    row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
    with django_capture_on_commit_callbacks(execute=False) as first:
        row.interval_s = 60
        row.save()
    with django_capture_on_commit_callbacks(execute=False) as second:
        row.interval_s = 90
        row.save()
    [*second_pushes] = second
    for callback in [*second_pushes, *first]:  # the first push delayed past the second
        callback()
    info = zstore.get(row.job_id)
    assert info.job.interval_s == 90
    assert version_in_redis(zstore, row.job_id) == row.version
    assert not ZSchedOutbox.objects.exists()  # the late one was confirmed as superseded


@pytest.mark.django_db
def test_a_push_of_a_save_that_arrives_after_its_delete_does_not_bring_the_job_back(
        zstore: Store, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False) as saved:
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
    with django_capture_on_commit_callbacks(execute=True):
        row.delete()
    assert zstore.get_many([row.job_id]) == [None]
    saved[0]()  # the create's push, delayed past the delete
    assert zstore.get_many([row.job_id]) == [None]
    assert not ZSchedOutbox.objects.exists()


@pytest.mark.django_db
def test_two_rest_edits_land_in_order_whatever_order_their_pushes_arrive(
        zstore: Store, django_capture_on_commit_callbacks: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Called on the test's own connection, not from the server's thread pool,
    # whose connections the writer recycles around each call.
    monkeypatch.setattr("celery_zsched.contrib.django.api_writer.close_old_connections",
                        lambda: None)
    writer, api = ModelWriter(), Actor("api", "t")
    with django_capture_on_commit_callbacks(execute=True):
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/r", interval_s=30)
    callbacks = []
    for interval in (40, 50):
        row.refresh_from_db()
        with django_capture_on_commit_callbacks(execute=False) as pushes:
            assert writer.replace(job(0, url=row.url, interval_s=interval),
                                  next(iter(row_tags(row))), api)
        callbacks.append(pushes[0])
    callbacks[1]()
    callbacks[0]()
    assert zstore.get(row.job_id).job.interval_s == 50


# ------------------------------------------------------------ the sweeper
@pytest.mark.django_db(transaction=True)
def test_the_sweeper_backs_off_while_redis_is_down_and_delivers_when_it_is_back(
        zstore: Store, settings: Any) -> None:
    row = ZSchedJob.objects.create(url="http://127.0.0.1:1/a", interval_s=30)
    sweeper = outbox.Sweeper()
    with redis_down(settings):
        row.interval_s = 75
        row.save()
        # The default interval (1 s) doubling to the default cap (2 s).
        assert [sweeper.step() for _ in range(4)] == [1.0, 2.0, 2.0, 2.0]
    [entry] = ZSchedOutbox.objects.all()
    assert (entry.attempts, entry.dead_at) == (0, None)  # an outage never counts
    assert sweeper.step() == 1.0  # back: delivered, and the next sweep in 1 s
    assert zstore.get(row.job_id).job.interval_s == 75
    assert not ZSchedOutbox.objects.exists()
    # Its report: nothing pending, for the exporter.
    report = zstore.outbox_report()
    assert (report.pending, report.dead, report.oldest_age_now_ms) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_change_that_fails_by_its_own_fault_backs_off_then_is_dead_lettered(
        zstore: Store) -> None:
    row = ZSchedJob.objects.create(job_id="bad", task="t", interval_s=30)
    ZSchedJob.objects.filter(pk=row.pk).update(cron="not cron")  # around the package
    with transaction.atomic():
        outbox.record(["bad"], outbox.SAVE, using="default", by=Actor("admin", "ann"))
    now = dj_timezone.now()
    delays = []
    for attempt in range(1, 11):  # the default zsched_outbox_max_attempts: 10
        report = outbox.sweep(now=now)
        assert (report.pushed, report.failed) == (0, 1)
        entry = ZSchedOutbox.objects.get()
        assert entry.attempts == attempt and "invalid row: cron" in entry.last_error
        delays.append((entry.next_try_at - now).total_seconds())
        assert outbox.sweep(now=entry.next_try_at - timedelta(milliseconds=1)).entries == 0
        now = entry.next_try_at
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert entry.dead_at is not None and report.dead == 1
    assert outbox.sweep(now=now + timedelta(days=1)).entries == 0  # dead: left alone
    assert outbox.status().dead == 1
    # A newer change of the job supersedes it: pushed, and the dead entry goes too.
    row.refresh_from_db()
    row.cron, row.interval_s = "0 9 * * *", None
    row.save()
    assert not ZSchedOutbox.objects.exists()
    assert zstore.get("bad").job.cron == "0 9 * * *"


@pytest.mark.django_db(transaction=True)
def test_dead_letters_are_shown_in_the_admin_and_retried_on_request(
        admin_client: Client, zstore: Store) -> None:
    ZSchedJob.objects.create(job_id="bad", task="t", interval_s=30)
    ZSchedJob.objects.filter(job_id="bad").update(interval_s=-5)
    with transaction.atomic():
        outbox.record(["bad"], outbox.SAVE, using="default", by=Actor("admin", "ann"))
    ZSchedOutbox.objects.update(attempts=9)
    outbox.sweep()
    entry = ZSchedOutbox.objects.get()
    assert entry.dead_at is not None
    page = admin_client.get(reverse(OUTBOX), {"state": "dead"}).content.decode()
    assert "dead-lettered" in page and "bad" in page and "invalid row: interval_s" in page
    response = admin_client.post(reverse(OUTBOX), {"action": "retry_now",
                                                   "_selected_action": [entry.pk]}, follow=True)
    assert response.status_code == 200
    entry.refresh_from_db()
    assert (entry.dead_at, entry.attempts) == (None, 0)


# -------------------------------------------------------------- warnings
@pytest.mark.django_db(transaction=True)
def test_zsched_stats_and_the_dashboard_warn_when_the_oldest_change_is_too_old(
        admin_client: Client, zstore: Store, settings: Any) -> None:
    with redis_down(settings):
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/late", interval_s=30)
    out = io.StringIO()
    call_command("zsched_stats", stdout=out)
    assert "Outbox (changes not in Redis yet): 1 pending" in out.getvalue()
    assert "WARNING" not in out.getvalue()  # younger than the default 60 s
    ZSchedOutbox.objects.update(created_at=dj_timezone.now() - timedelta(seconds=61))
    out = io.StringIO()
    call_command("zsched_stats", stdout=out)
    assert "WARNING: the oldest of 1 change(s)" in out.getvalue()
    stats = json.loads(_stats_json())
    assert stats["outbox"]["pending"] == 1 and stats["outbox"]["oldest_age_s"] > 60
    page = admin_client.get(reverse("admin:zsched_dashboard")).content.decode()
    assert "Warning:" in page and "zsched_outbox_warn_s" in page
    # With Redis down too: the outbox is what stats still show, on stderr.
    with redis_down(settings):
        err = io.StringIO()
        with pytest.raises(CommandError):
            call_command("zsched_stats", stdout=io.StringIO(), stderr=err)
        assert "WARNING: the oldest of 1 change(s)" in err.getvalue()
        page = admin_client.get(reverse("admin:zsched_dashboard")).content.decode()
        assert "Redis unavailable" in page and "1 pending" in page
    assert row.job_id in {e.job_id for e in ZSchedOutbox.objects.all()}


def _stats_json() -> str:
    out = io.StringIO()
    call_command("zsched_stats", "--json", stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_exporter_shows_outbox_depth_and_age_on_the_redis_clock(
        zstore: Store, settings: Any) -> None:
    with redis_down(settings):
        ZSchedJob.objects.create(url="http://127.0.0.1:1/x", interval_s=30)
    ZSchedOutbox.objects.update(created_at=dj_timezone.now() - timedelta(seconds=30))
    sweeper = outbox.Sweeper()
    # The sweeper reports what it counted (here without pushing: nothing is due yet).
    ZSchedOutbox.objects.update(next_try_at=dj_timezone.now() + timedelta(hours=1))
    sweeper.step()
    report = zstore.outbox_report()
    assert report.pending == 1 and 30_000 <= report.oldest_age_ms < 40_000
    # The exporter ages it on Redis' clock since the report.
    zstore.client.hset(zstore.base.outbox, "at", report.now_ms - 5_000)
    values = {m.name: m.samples[0].value for m in StoreCollector(zstore).collect()
              if m.name.startswith("zsched_outbox")}
    assert values["zsched_outbox_pending"] == 1 and values["zsched_outbox_dead"] == 0
    assert 35 <= values["zsched_outbox_oldest_age_seconds"] < 45


# ------------------------------------------------------------ the thread
@pytest.mark.django_db(transaction=True)
def test_beat_init_starts_one_sweeper_per_process(zstore: Store, settings: Any) -> None:
    with redis_down(settings):
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/t", interval_s=30)
    try:
        beat_init.send(sender=None)
        beat_init.send(sender=None)
        threads = [t for t in threading.enumerate() if t.name == "zsched-outbox"]
        assert len(threads) == 1
        _wait(lambda: not ZSchedOutbox.objects.exists(), "the sweeper to push the change")
    finally:
        outbox.stop_sweeper()
    assert zstore.get(row.job_id).job.url == row.url


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -------------------------------------------------------------- settings
OUTBOX_SETTINGS = {"outbox_interval_s": 1.0, "outbox_backoff_max_s": 2.0,
                   "outbox_max_attempts": 10, "outbox_warn_s": 60.0}


def test_the_outbox_settings_have_defaults_env_overrides_and_a_readme_row(
        settings: Any) -> None:
    from celery_zsched.config import Settings
    from tests.docs_pages import page

    defaults = conf.DjangoSettings.from_django(env={})
    assert {name: getattr(defaults, name) for name in OUTBOX_SETTINGS} == OUTBOX_SETTINGS
    settings.CELERY_ZSCHED_OUTBOX_WARN_S = 30
    assert conf.DjangoSettings.from_django(env={}).outbox_warn_s == 30.0
    assert conf.DjangoSettings.from_django(env={"ZSCHED_OUTBOX_WARN_S": "5"}).outbox_warn_s == 5
    for name, bad in (("outbox_interval_s", 0), ("outbox_max_attempts", 0),
                      ("outbox_backoff_max_s", "soon"), ("outbox_max_attempts", 2.5)):
        with pytest.raises(conf.ConfigurationError, match=f"ZSCHED_{name.upper()}"):
            conf.DjangoSettings.from_django(env={f"ZSCHED_{name.upper()}": str(bad)})
    # Beat shares the CELERY_ZSCHED_* namespace: it accepts them and leaves them alone.
    assert Settings.from_mapping({"zsched_outbox_warn_s": 1}, env={}).tombstone_ttl_s == 86_400
    reference = page("reference/configuration.md")
    for name, default in [*OUTBOX_SETTINGS.items(), ("tombstone_ttl_s", 86_400)]:
        assert (f"| `zsched_{name}` | `ZSCHED_{name.upper()}` | `{default:g}` |"
                in reference), name


@pytest.mark.django_db(transaction=True)
def test_a_redis_out_of_memory_is_an_outage_never_a_changes_fault(
        settings: Any, tmp_path: Path) -> None:
    from celery_zsched.core.errors import StoreUnavailable
    from tests.servers import RedisServer, running

    with running(RedisServer(tmp_path / "redis")) as (server,):
        settings.CELERY_ZSCHED_REDIS_URL = server.url()
        row = ZSchedJob.objects.create(url="http://127.0.0.1:1/oom", interval_s=30)
        with server.admin() as admin:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            row.interval_s = 45
            row.save()  # its push is refused: OOM
            with pytest.raises(StoreUnavailable, match="refuses writes"):
                outbox.sweep()
            assert ZSchedOutbox.objects.get().attempts == 0
            admin.config_set("maxmemory", 0)
        assert outbox.sweep().pushed == 1
        assert conf.get_store().get(row.job_id).job.interval_s == 45
