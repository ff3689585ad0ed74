"""An edit is never lost: admin changes reach beat within seconds after Redis is back, in order.

Real processes: a Django "web" process (:mod:`tests.e2e.dj_web`) makes the
changes, a real ``celery beat`` of the Django project (its outbox sweeper starts
by itself on ``beat_init``) and a worker run the jobs, and the store is a
redis-server this test stops and starts (with its append-only file, as a
restarted production Redis keeps its data), or a Sentinel group whose master is
killed. Django runs on SQLite (a file both processes share) and on PostgreSQL.
Default settings throughout; every "within 10 s" is measured on Redis' clock.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.core import audit
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store, audit_log
from e2e.conftest import REPO_ROOT, Deployment, TargetServer, wait_for
from e2e.names import SCRAPE_TASK
from tests.servers import RedisServer, SentinelGroup, running, sentinel_group

pytestmark = pytest.mark.slow

#: Where Redis must have every change, after it is reachable again (Redis' clock).
BOUND_MS = 10_000
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


# ------------------------------------------------------------------ databases
@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database for the Django processes: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'zsched.sqlite3'}"
        return
    psycopg = pytest.importorskip("psycopg")
    name = f"zsched_e2e_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgres://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_env(database: str) -> dict[str, str]:
    """What makes a process of the deployment a process of the Django project."""
    return {"DJANGO_SETTINGS_MODULE": "tests.django_settings", "DATABASE_URL": database}


# ---------------------------------------------------------------- web process
class Web:
    """The Django web process: one JSON command per line in, one answer per line out."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.dj_web"], cwd=REPO_ROOT, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    def send(self, **command: Any) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(command) + "\n").encode())
        self.popen.stdin.flush()

    def call(self, timeout: float = 60, **command: Any) -> dict[str, Any]:
        assert self.popen.stdout is not None
        self.send(**command)
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline() if ready else b""
        if not line:
            raise AssertionError(f"web process gave no answer to {command}:\n"
                                 f"{self.log.read_text(errors='replace')[-4000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def web_for(tmp_path: Path) -> Iterator[Callable[[Deployment, str], Web]]:
    """Start web processes of a deployment on a database; all stopped in teardown."""
    started: list[Web] = []

    def start(d: Deployment, database: str) -> Web:
        web = Web({**d.env, **django_env(database)}, tmp_path / f"web-{len(started)}.log")
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()


# ------------------------------------------------------------------- helpers
def redis_now(store: Store) -> int:
    """Redis' clock, waiting while the store is unreachable (restart, failover)."""
    def now() -> int | None:
        with contextlib.suppress(StoreUnavailable):
            return store.now_ms()
        return None
    value: int = wait_for(now, 60, "the store to answer", interval=0.05)
    return value


def changes_since(store: Store, job_id: str, since_ms: int) -> list[audit.Change]:
    """The audit trail's changes of ``job_id`` made at or after ``since_ms`` (Redis' clock)."""
    return [c for c in reversed(audit_log.history(store, job_id, limit=100))
            if c.at.timestamp() * 1000 >= since_ms]


def at_ms(change: audit.Change) -> int:
    return round(change.at.timestamp() * 1000)


def settle_events(store: Store, job_id: str) -> list[dict[str, Any]]:
    """The settle events of ``job_id`` (their ``data``: due, promoted, started ms)."""
    out = []
    for _id, fields in store.events(count=100_000):
        if fields.get("id") == job_id:
            out.append(json.loads(fields.get("data") or "{}"))
    return out


def three_jobs(web: Web, target: TargetServer, tag: str) -> tuple[str, str, str]:
    """Create the jobs to edit, delete and pause (every 2 s, each its own target path)."""
    assert web.call(op="migrate") == {"ok": True}
    ids = []
    for name in ("edit", "delete", "pause"):
        answer = web.call(op="save", fields={"url": target.url(f"/ok/{tag}-{name}"),
                                             "interval_s": 2, "name": name})
        ids.append(answer["job_id"])
    return ids[0], ids[1], ids[2]


def change_the_three(web: Web, edit: str, delete: str, pause: str) -> None:
    assert web.call(op="save", job_id=edit, fields={"interval_s": 3, "name": "edited"})
    assert web.call(op="delete", job_id=delete) == {"deleted": 1}
    assert web.call(op="pause", job_id=pause)["rows"] == 1


def in_redis(store: Store, edit: str, delete: str, pause: str) -> bool:
    """The three changes are all in Redis."""
    with contextlib.suppress(StoreUnavailable):
        infos = store.get_many([edit, delete, pause])
        return (infos[0] is not None and infos[0].job.interval_s == 3
                and infos[0].job.name == "edited" and infos[1] is None
                and infos[2] is not None and infos[2].paused)
    return False


def assert_each_change_recorded_once(store: Store, since_ms: int, edit: str, delete: str,
                                     pause: str) -> int:
    """Each change is in the audit trail once, as alice's; returns when the last one was."""
    last = 0
    for job_id, action in ((edit, "edit"), (delete, "delete"), (pause, "pause")):
        changes = changes_since(store, job_id, since_ms)
        assert [(c.action, c.actor.kind, c.actor.name) for c in changes] == [
            (action, "admin", "alice")], (job_id, changes)
        last = max(last, at_ms(changes[0]))
    return last


# ----------------------------------------------------------------- the tests
def test_save_delete_and_pause_during_a_redis_outage_reach_beat_within_10_s_of_its_return(
        database_url: str, deploy: Callable[..., Deployment], web_for: Any,
        target: TargetServer, tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "store", args=["--appendonly", "yes",
                                                   "--appendfsync", "always"])
    with running(server):
        d = deploy(store_url=server.url(), default_task=SCRAPE_TASK)
        web = web_for(d, database_url)
        edit, delete, pause = three_jobs(web, target, "outage")
        assert web.call(op="state")["outbox"] == []  # every push confirmed
        beat = d.start_beat(env=django_env(database_url))
        d.start_worker()
        d.wait_for(lambda: all(target.hits(f"/ok/outage-{n}") for n in ("edit", "delete",
                                                                          "pause")),
                   60, "every job to run before the outage")
        d.wait_for(lambda: "zsched outbox: sweeper started" in beat.text(), 10,
                   "beat to start the outbox sweeper by itself")
        outage_ms = redis_now(d.store)

        server.stop()  # SIGKILL: a crash, or the network cut off
        change_the_three(web, edit, delete, pause)
        pending = web.call(op="state")["outbox"]
        assert sorted((job_id, action) for job_id, action, _ in pending) == sorted(
            [(edit, "save"), (delete, "delete"), (pause, "pause")])
        time.sleep(4)  # long enough for the sweeper to reach its longest backoff
        assert beat.alive()

        server.start()  # the same port and data directory: Redis kept its data
        back_ms = redis_now(d.store)
        # No zsched_sync: beat's sweeper brings them. The wait is only a bound on
        # how long to look; the guarantee is asserted on Redis' clock below.
        d.wait_for(lambda: in_redis(d.store, edit, delete, pause), 60,
                   "the three changes in Redis")
        last_ms = assert_each_change_recorded_once(d.store, outage_ms, edit, delete, pause)
        assert last_ms - back_ms <= BOUND_MS, (last_ms - back_ms)
        # The sweeper confirms each push (deletes its entry) after Redis applied it.
        d.wait_for(lambda: web.call(op="state")["outbox"] == [], 30,
                   "the sweeper to confirm its pushes")
        assert "cannot push pending changes" in beat.text()

        # The deleted job never runs again: beat runs the others on, and nothing of
        # the deleted one is promoted after its delete reached Redis.
        deleted_ms = at_ms(changes_since(d.store, delete, outage_ms)[0])
        d.wait_for(lambda: any(e.get("promoted_ms", 0) > deleted_ms + 4_000
                               for e in settle_events(d.store, edit)), 90,
                   "the edited job to run on, every 3 s, after the return")
        assert all(e.get("promoted_ms", 0) < deleted_ms
                   for e in settle_events(d.store, delete))
        assert d.store.get_many([delete]) == [None]
        assert not d.store.client.hexists(d.store.keys.state, delete)
        assert d.store.get(pause).paused
        print(f"\n[{database_url.split(':')[0]}] outage: the 3 changes were in Redis "
              f"{last_ms - back_ms} ms after it was back (Redis clock)")


def test_a_change_whose_web_process_died_between_commit_and_push_reaches_redis_within_10_s(
        database_url: str, deploy: Callable[..., Deployment], web_for: Any,
        target: TargetServer) -> None:
    d = deploy(default_task=SCRAPE_TASK)
    web = web_for(d, database_url)
    edit, _delete, _pause = three_jobs(web, target, "crash")
    beat = d.start_beat(env=django_env(database_url))
    d.wait_for(lambda: "zsched outbox: sweeper started" in beat.text(), 30,
               "beat to start the outbox sweeper by itself")
    before = d.store.get(edit).state.version
    sent_ms = redis_now(d.store)
    web.send(op="save_then_die", job_id=edit, fields={"interval_s": 3, "name": "edited"})
    assert web.popen.wait(30) == -9  # SIGKILLed by its own first on-commit callback
    killed_ms = redis_now(d.store)
    other = web_for(d, database_url)
    row = other.call(op="state")["rows"][edit]
    assert row["interval_s"] == 3 and row["version"] > (before or 0)  # committed
    d.wait_for(lambda: d.store.get(edit).job.interval_s == 3, 30,
               "the committed change in Redis")
    [change] = changes_since(d.store, edit, sent_ms)
    assert (change.action, change.actor.name) == ("edit", "alice")
    assert at_ms(change) - killed_ms <= BOUND_MS
    assert d.store.get(edit).state.version == row["version"]
    d.wait_for(lambda: other.call(op="state")["outbox"] == [], 30,
               "the sweeper to confirm its push")
    print(f"\n[{database_url.split(':')[0]}] crash: the change was in Redis "
          f"{at_ms(change) - killed_ms} ms after the web process died (Redis clock)")


def test_save_delete_and_pause_during_a_sentinel_failover_lose_nothing_and_resurrect_nothing(
        deploy: Callable[..., Deployment], web_for: Any, target: TargetServer,
        tmp_path: Path) -> None:
    with sentinel_group(tmp_path / "sentinel") as group:
        _failover(group, deploy, web_for, target, tmp_path)


def _failover(group: SentinelGroup, deploy: Callable[..., Deployment], web_for: Any,
              target: TargetServer, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'failover.sqlite3'}"
    d = deploy(store_url=group.url, sentinel_master=group.name, default_task=SCRAPE_TASK)
    web = web_for(d, database)
    edit, delete, pause = three_jobs(web, target, "failover")
    beat = d.start_beat(env=django_env(database))
    d.start_worker()
    d.wait_for(lambda: all(target.hits(f"/ok/failover-{n}") for n in ("edit", "delete",
                                                                        "pause")),
               60, "every job to run before the failover")
    old_definition = d.store.get(delete).job
    old_version = d.store.get(delete).state.version
    with group.master.admin() as master:  # the replica has everything so far
        assert master.execute_command("WAIT", 1, 5000) == 1
    started_ms = redis_now(d.store)

    old_port = group.master_port()
    group.master.stop()  # SIGKILL; the Sentinel promotes the replica
    change_the_three(web, edit, delete, pause)
    # Made before the promotion (the Sentinel waits 1 s to call the master down):
    # their pushes failed, and the outbox holds them.
    during = web.call(op="state")["outbox"]
    assert during, "every change reached a master: the failover came before them"
    new_port = group.wait_failover(old_port)
    assert new_port == group.replica.port
    promoted_ms = redis_now(d.store)  # the new master's clock

    d.wait_for(lambda: in_redis(d.store, edit, delete, pause), 60,
               "the three changes on the new master")
    last_ms = assert_each_change_recorded_once(d.store, started_ms, edit, delete, pause)
    assert last_ms - promoted_ms <= BOUND_MS, (last_ms - promoted_ms)
    d.wait_for(lambda: web.call(op="state")["outbox"] == [], 30,
               "the sweeper to confirm its pushes")
    # Nothing resurrected: a late push of the deleted job's old definition, as a
    # web process that hung across the failover would send, is refused.
    late = d.store.upsert(old_definition, version=old_version)
    assert (late.stale, late.created) == (1, 0)
    time.sleep(3)  # beat keeps running; the deleted job stays deleted
    assert d.store.get_many([delete]) == [None]
    assert d.store.get(pause).paused and d.store.get(edit).job.interval_s == 3
    assert beat.alive()
    print(f"\nfailover: {len(during)} change(s) waited in the outbox; all 3 were on the new "
          f"master {last_ms - promoted_ms} ms after its promotion (Redis clock)")
