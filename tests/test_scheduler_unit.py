"""ZSchedScheduler in-process against the throwaway Redis, which is also the Celery broker."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery import Celery
from celery.schedules import crontab

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.config import Settings
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.timing import cron_next, dt_to_ms, ms_to_dt
from celery_zsched.services.beat_entries import job_from_entry, static_job_id
from celery_zsched.store import Store, audit_log, task_id_for
from tests.servers import RedisServer, running

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ZSCHED_* variable of the developer's shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    """Settings (unique key prefix) shared by the app and the test's own store."""
    return make_settings()


@pytest.fixture
def store(rclient: redis.Redis, settings: Settings) -> Store:
    """The test's view of the scheduler's store (same prefix, its own client)."""
    return Store(rclient, settings)


@pytest.fixture
def make_app(settings: Settings, redis_url: str) -> Callable[..., Celery]:
    """A Celery app whose broker and zsched store are the throwaway Redis."""
    def make(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery("scheduler-tests", set_as_current=False)
        app.conf["broker_url"] = redis_url
        app.conf.zsched_redis_url = settings.redis_url
        app.conf.zsched_key_prefix = settings.key_prefix
        app.conf.beat_schedule = beat_schedule or {}
        app.conf.update(conf)
        return app
    return make


@pytest.fixture
def start(make_app: Callable[..., Celery]) -> Iterator[Callable[..., ZSchedScheduler]]:
    """Start schedulers (closed at teardown)."""
    started: list[ZSchedScheduler] = []

    def start_scheduler(beat_schedule: dict[str, Any] | None = None, *,
                        app: Celery | None = None, **kwargs: Any) -> ZSchedScheduler:
        scheduler = ZSchedScheduler(app=app or make_app(beat_schedule), **kwargs)
        started.append(scheduler)
        return scheduler
    yield start_scheduler
    for scheduler in started:
        scheduler.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _messages(client: redis.Redis, queue: str = "celery") -> list[dict[str, Any]]:
    """Decode the kombu messages waiting in a Redis broker list (oldest first)."""
    out = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        message = json.loads(raw)
        assert message["properties"]["body_encoding"] == "base64"
        message["decoded_body"] = json.loads(base64.b64decode(message["body"]))
        out.append(message)
    return out


def _job(job_id: str, **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 60, "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


def _berlin_nightly() -> crontab:
    schedule = crontab(minute=30, hour=2)
    schedule.tz = BERLIN  # type: ignore[misc,assignment]  # a per-entry zone, as users do
    return schedule


# ------------------------------------------------------------ static entries
def test_static_beat_schedule_entries_are_imported_as_jobs(
    start: Callable[..., ZSchedScheduler], store: Store,
) -> None:
    """A float, a timedelta and a crontab with a zone become static jobs in Redis."""
    before = store.now_ms()
    start({
        "add-every-10s": {"task": "tests.add", "schedule": 10.0, "args": (1, 2)},
        "report every 5 minutes": {"task": "tests.report", "schedule": timedelta(minutes=5),
                                   "kwargs": {"full": True}, "options": {"queue": "q1"}},
        "berlin-nightly": {"task": "tests.nightly", "schedule": _berlin_nightly()},
    })
    report_id = static_job_id("report every 5 minutes")
    assert report_id.startswith("beat-")
    assert store.static_ids() == {"add-every-10s", report_id, "berlin-nightly"}

    add = store.get("add-every-10s")
    assert (add.job.task, add.job.interval_s, add.job.args) == ("tests.add", 10.0, [1, 2])
    assert add.due_ms is not None and 0 <= add.due_ms - before < 1000

    report = store.get(report_id)
    assert (report.job.name, report.job.interval_s, report.job.kwargs, report.job.queue) == (
        "report every 5 minutes", 300.0, {"full": True}, "q1")

    nightly = store.get("berlin-nightly")
    assert (nightly.job.cron, nightly.job.timezone) == ("30 2 * * *", "Europe/Berlin")
    expected = dt_to_ms(cron_next("30 2 * * *", BERLIN, ms_to_dt(before - 1)))
    assert nightly.due_ms == expected
    assert ms_to_dt(expected).astimezone(BERLIN).strftime("%M") == "30"


def test_restart_deletes_removed_static_jobs_updates_changed_ones_keeps_dynamic_ones(
    start: Callable[..., ZSchedScheduler], store: Store,
) -> None:
    """A second start reconciles beat_schedule; jobs added at run time are never touched."""
    start({
        "keep": {"task": "tests.keep", "schedule": 60.0},
        "change": {"task": "tests.change", "schedule": 10.0, "args": (1,)},
        "remove": {"task": "tests.remove", "schedule": 30.0},
    })
    store.upsert(_job("dynamic", meta={"from": "cli"}))
    dynamic_before = (store.client.hget(store.keys.defs, "dynamic"),
                      store.client.zscore(store.keys.schedule, "dynamic"))
    keep_due = store.client.zscore(store.keys.schedule, "keep")
    change_due = store.client.zscore(store.keys.schedule, "change")
    store.client.zadd(store.keys.schedule, {"change": 1_000}, xx=True)  # visible if it moves

    start({
        "keep": {"task": "tests.keep", "schedule": 60.0},
        "change": {"task": "tests.change", "schedule": 20.0, "args": (2,)},
    })
    assert store.static_ids() == {"keep", "change"}
    assert store.get_many(["remove"]) == [None]
    assert store.client.zscore(store.keys.schedule, "remove") is None
    assert (store.client.hget(store.keys.defs, "dynamic"),
            store.client.zscore(store.keys.schedule, "dynamic")) == dynamic_before
    assert store.client.zscore(store.keys.schedule, "keep") == keep_due
    changed = store.get("change")
    assert (changed.job.interval_s, changed.job.args) == (20.0, [2])
    assert changed.due_ms is not None and changed.due_ms != 1_000, "new timing reschedules"
    assert change_due is not None
    # The audit trail names beat's config sync; the unchanged entry recorded nothing.
    config = Actor("reconcile", "beat_schedule")
    assert [(c.action, c.actor) for c in audit_log.history(store, "change")] == [
        ("edit", config), ("create", config)]
    assert audit_log.history(store, "change")[0].diff == {"args": [[1], [2]],
                                                       "interval_s": [10.0, 20.0]}
    assert [c.action for c in audit_log.history(store, "keep")] == ["create"]
    removed = audit_log.history(store, "remove")[0]
    assert (removed.action, removed.actor) == ("delete", config)


# ------------------------------------------------------- lazy / unavailable
def test_lazy_scheduler_and_info_do_not_connect_to_redis(
    make_app: Callable[..., Celery], caplog: pytest.LogCaptureFixture,
) -> None:
    """lazy=True and the .info banner never touch Redis: a closed port raises nothing."""
    port = _closed_port()
    app = make_app({"static": {"task": "tests.t", "schedule": 5.0}},
                   zsched_redis_url=f"redis://:s3cret@127.0.0.1:{port}/0",
                   broker_url=f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.DEBUG, logger="celery_zsched"):
        scheduler = ZSchedScheduler(app=app, lazy=True)
        banner = scheduler.info
    assert f"127.0.0.1:{port}/0" in banner and "s3cret" not in banner
    assert "store" not in scheduler.__dict__
    assert scheduler.schedule == {}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_lazy_scheduler_opens_no_connection_and_writes_nothing(
    make_app: Callable[..., Celery], rclient: redis.Redis,
) -> None:
    """Against a live Redis, lazy construction and .info open no connection at all."""
    app = make_app({"static": {"task": "tests.t", "schedule": 5.0}})
    connections = int(rclient.info("stats")["total_connections_received"])
    scheduler = ZSchedScheduler(app=app, lazy=True)
    assert scheduler.info.startswith("    . zsched -> redis://")
    assert int(rclient.info("stats")["total_connections_received"]) == connections
    assert rclient.dbsize() == 0


def test_scheduler_on_a_closed_port_backs_off_and_warns(
    make_app: Callable[..., Celery], caplog: pytest.LogCaptureFixture,
) -> None:
    """A non-lazy scheduler with Redis down starts, and tick() returns a growing backoff."""
    port = _closed_port()
    app = make_app({"static": {"task": "tests.t", "schedule": 5.0}},
                   zsched_redis_url=f"redis://127.0.0.1:{port}/0",
                   broker_url=f"redis://127.0.0.1:{port}/0")
    with caplog.at_level(logging.WARNING, logger="celery_zsched"):
        scheduler = ZSchedScheduler(app=app)
        first = scheduler.tick()
        second = scheduler.tick()
    assert 0 < first < second <= 30
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "celery_zsched"]
    assert any("cannot import beat_schedule" in w for w in warnings)
    assert any("retrying in" in w for w in warnings)
    scheduler.close()


# ------------------------------------------------------------------ publish
def test_tick_publishes_due_jobs_with_task_id_headers_and_routing(
    start: Callable[..., ZSchedScheduler], store: Store, rclient: redis.Redis,
) -> None:
    """Messages carry the deterministic task id, the zsched_* headers and the job's queue."""
    scheduler = start()
    url_job = Job.from_dict({"url": "https://example.com/feed", "meta": {"lang": "de"},
                             "jitter_s": 0})
    routed = _job("routed", task="tests.route", args=[1, "x"], kwargs={"k": 2}, queue="q1")
    store.upsert(url_job)
    store.upsert(routed)
    dues = {j.id: store.client.zscore(store.keys.schedule, j.id) for j in (url_job, routed)}
    before = store.now_ms()
    scheduler.tick()
    after = store.now_ms()

    default_queue, q1 = _messages(rclient, "celery"), _messages(rclient, "q1")
    assert len(default_queue) == 1 and len(q1) == 1
    for message, job in ((default_queue[0], url_job), (q1[0], routed)):
        headers = message["headers"]
        state = store.get(job.id).state
        assert headers["zsched_job_id"] == job.id
        assert headers["zsched_occurrence"] == state.occurrence
        assert headers["zsched_attempt"] == 1
        assert headers["zsched_due_ms"] == dues[job.id]
        assert before <= headers["zsched_promoted_ms"] <= after
        assert headers["id"] == task_id_for(job.id, state.occurrence, 1)
        assert headers["task"] == job.task
    assert default_queue[0]["headers"]["task"] == "scrape"
    args, kwargs, _embed = default_queue[0]["decoded_body"]
    assert (args, kwargs) == ([], {"url": "https://example.com/feed", "meta": {"lang": "de"}})
    args, kwargs, _embed = q1[0]["decoded_body"]
    assert (args, kwargs) == ([1, "x"], {"k": 2})
    assert q1[0]["properties"]["delivery_info"]["routing_key"] == "q1"

    # Beat records where each message went, for the reaper's liveness question.
    assert (store.get(url_job.id).state.queue, store.get(routed.id).state.queue) == (
        "celery", "q1")
    # In flight: never promoted again, so each queue holds one message per job.
    scheduler.tick()
    assert (rclient.llen("celery"), rclient.llen("q1")) == (1, 1)
    assert store.client.zcard(store.keys.queued) == 2


# ---------------------------------------------------------------- tick wait
def test_tick_returns_seconds_until_the_next_due_job_capped_by_max_interval(
    start: Callable[..., ZSchedScheduler], store: Store,
) -> None:
    """The sleep is the time to the next due score, at most max_interval."""
    scheduler = start()
    assert scheduler.max_interval == 1
    assert scheduler.tick() == 1.0  # nothing stored
    store.upsert(_job("soon"))
    store.client.zadd(store.keys.schedule, {"soon": store.now_ms() + 400}, xx=True)
    wait = scheduler.tick()
    assert 0.3 < wait <= 0.4
    store.client.zadd(store.keys.schedule, {"soon": store.now_ms() + 3_600_000}, xx=True)
    assert scheduler.tick() == 1.0

    patient = start(max_interval=5)
    assert patient.tick() == 5.0
    store.client.zadd(store.keys.schedule, {"soon": store.now_ms() + 3_000}, xx=True)
    assert 2.9 < patient.tick() <= 3.0


def test_a_tick_claims_again_while_batches_come_back_full(
    start: Callable[..., ZSchedScheduler], make_app: Callable[..., Celery], store: Store,
    rclient: redis.Redis,
) -> None:
    """A full batch means more may be due: the tick claims the next one at once (while
    it publishes the batch before), until a batch is not full."""
    scheduler = start(app=make_app(zsched_batch_size=3))
    # Two full batches: as many as the queue's default bound (a fifth of 10 x 3) admits.
    store.upsert_many([_job(f"due-{i}") for i in range(6)], stagger=False)
    assert scheduler.tick() > 0
    ids = [m["headers"]["zsched_job_id"] for m in _messages(rclient)]
    assert sorted(ids) == [f"due-{i}" for i in range(6)]
    assert store.client.zcard(store.keys.schedule) == 0
    assert all(store.get(f"due-{i}").state.publishes == 1 for i in range(6))


def test_tick_returns_zero_when_its_last_batch_was_full(
    start: Callable[..., ZSchedScheduler], make_app: Callable[..., Celery], store: Store,
    rclient: redis.Redis,
) -> None:
    """Past its time budget (``max_interval``), a tick stops after a full batch and asks
    to run again at once."""
    scheduler = start(app=make_app(zsched_batch_size=3))
    scheduler.max_interval = 1e-9  # the budget ends with the first batch
    store.upsert_many([_job(f"due-{i}") for i in range(5)], stagger=False)
    assert scheduler.tick() == 0.0
    assert rclient.llen("celery") == 3
    assert scheduler.tick() > 0
    assert rclient.llen("celery") == 5
    assert store.client.zcard(store.keys.schedule) == 0


def test_a_failed_publish_gives_back_the_claim_made_meanwhile(
    start: Callable[..., ZSchedScheduler], make_app: Callable[..., Celery], store: Store,
    tmp_path: Path,
) -> None:
    """The broker refuses a batch while the next one is being claimed: both go back to
    the schedule at once, none waits out its publish deadline."""
    with running(RedisServer(tmp_path)) as (broker,):
        scheduler = start(app=make_app(zsched_batch_size=3, broker_url=broker.url()))
        store.upsert(_job("warm"))
        assert scheduler.tick() > 0  # connected, queue declared
        broker.stop()
        jobs = [f"due-{i}" for i in range(6)]
        store.upsert_many([_job(job_id) for job_id in jobs], stagger=False)
        assert scheduler.tick() >= 1.0  # backing off
    # Every one of them is back in the schedule ("warm" was published before).
    assert sorted(store.client.zrange(store.keys.schedule, 0, -1)) == jobs


def test_beat_does_not_load_all_jobs(
    start: Callable[..., ZSchedScheduler], store: Store, rclient: redis.Redis,
) -> None:
    """With 5,000 jobs none due, a tick claims nothing, reads little and keeps nothing."""
    later_s = (store.now_ms() + 3_600_000) / 1000
    store.upsert_many([_job(f"idle-{i:04d}", start_at=later_s) for i in range(5_000)])
    scheduler = start()
    rclient.config_resetstat()
    sent_before = int(rclient.info("stats")["total_net_output_bytes"])
    assert scheduler.tick() == 1.0
    sent = int(rclient.info("stats")["total_net_output_bytes"]) - sent_before
    stats = rclient.info("commandstats")
    assert scheduler.schedule == {}
    assert rclient.llen("celery") == 0
    assert store.client.zcard(store.keys.schedule) == 5_000
    assert store.client.zcard(store.keys.leases) == 0
    # 5,000 definitions are ~500 kB; an idle tick moves a few hundred bytes plus INFO replies.
    assert sent < 20_000
    for bulk_read in ("hscan", "hvals", "hkeys", "hmget", "zscan", "smembers"):
        assert f"cmdstat_{bulk_read}" not in stats
    # The claim reads each queue's in-flight count (a hash of one field per queue,
    # here one): never the definitions, which the bytes above would show.
    assert int(stats.get("cmdstat_hgetall", {"calls": 0})["calls"]) <= 1
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    assert calls < 20


def test_redelivery_of_an_expired_lease_is_published_again_despite_misfire_grace(
    start: Callable[..., ZSchedScheduler], make_app: Callable[..., Celery], store: Store,
    rclient: redis.Redis,
) -> None:
    """A lost message is re-sent with the same task id; misfire grace only skips first fires."""
    scheduler = start(app=make_app(zsched_delivery_timeout_s=0.05))
    store.upsert(_job("lost"))
    scheduler.tick()
    first = _messages(rclient)
    assert [m["headers"]["zsched_job_id"] for m in first] == ["lost"]
    # The grace comes once the first fire is out (an edit leaves what is in flight
    # alone): a first tick late on a loaded host must not skip that fire, while the
    # redelivery below is later than the grace by the sleep, whatever the host does.
    store.upsert(_job("lost", misfire_grace_s=0.05))
    rclient.delete("celery")  # the broker lost the message
    store.heartbeat([], "worker@host:1", ["celery"])  # while a worker consumed its queue
    time.sleep(0.1)
    # The claim that published it saw only its publish deadline: the next tick's claim
    # reports the (shorter) delivery deadline the confirmation set, the one after reaps.
    scheduler.tick()
    scheduler.tick()
    again = _messages(rclient)
    assert [m["headers"]["zsched_job_id"] for m in again] == ["lost"]
    assert again[0]["headers"]["id"] == first[0]["headers"]["id"]
    assert again[0]["headers"]["zsched_occurrence"] == first[0]["headers"]["zsched_occurrence"]
    assert store.get("lost").state.publishes == 2
    assert store.get("lost").state.crashes == 0, "a lost message is not a crash"
    assert store.get("lost").state.last_outcome is None, "the occurrence was not settled as skipped"


def test_crontab_with_lists_of_numbers_becomes_a_cron_expression() -> None:
    """crontab(minute=[30, 0], hour=[11, 9, 10]) is imported as "0,30 9-11 * * 1-5".

    The cron is written from the sets Celery expanded, with Celery's "and" day rule.
    """
    entry = {"task": "tests.t",
             "schedule": crontab(minute=[30, 0], hour=[11, 9, 10], day_of_week="mon-fri")}
    job = job_from_entry("office hours", entry, Defaults())
    assert (job.cron, job.day_rule) == ("0,30 9-11 * * 1-5", "and")
    assert (job.id, job.name) == (static_job_id("office hours"), "office hours")


def test_a_beat_schedule_entry_sets_its_transport_in_options(store: Store) -> None:
    entry = {"task": "tests.t", "schedule": 60, "options": {"transport": "http", "queue": "eu"}}
    job = job_from_entry("for go workers", entry, Defaults())
    assert (job.transport, job.queue) == ("http", "eu")
    store.upsert(job, static=True)
    assert store.client.zscore(store.keys.http_schedule, job.id) is not None
    assert store.client.zscore(store.keys.schedule, job.id) is None  # beat never sees it
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['bad'\]\.transport"):
        job_from_entry("bad", {**entry, "options": {"transport": "smtp"}}, Defaults())
