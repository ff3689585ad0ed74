"""The example project end to end: real runserver, worker and beat on a throwaway Redis.

Jobs imported with ``manage.py zsched_import`` fire against the project's own
fake feeds (served by ``runserver`` and, on more loopback hosts, by ``manage.py
serve_targets``), the worker settles them, ``manage.py zsched_drain`` copies
the history into SQLite, and the admin's change page (Django's test client,
inside the project) shows the runs.

The project paces requests per domain (one a second, one in flight), as the
demo does: each failing target has a host of its own, so a 429's closed gate
holds back only its own jobs, not the feeds'.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_zsched import Settings, Store
from tests.helpers import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
# Runs inside the example project (``manage.py shell``): an admin's view of every job.
ADMIN_PAGES = """
import json, os
from django.contrib.auth import get_user_model
from django.test import Client
from celery_zsched.contrib.django.models import ZSchedJob
user = get_user_model().objects.create_superuser("e2e", "e2e@example.com", "pw")
client = Client()
client.force_login(user)
pages = {}
for row in ZSchedJob.objects.all():
    response = client.get(f"/admin/zsched/zschedjob/{row.pk}/change/")
    pages[row.url.rsplit("/targets/", 1)[1]] = {
        "status": response.status_code, "html": response.content.decode(),
        "runs": row.runs.count()}
with open(os.environ["E2E_OUT"], "w") as fp:
    json.dump(pages, fp)
"""

pytestmark = pytest.mark.slow


class Procs:
    """Subprocesses of the example project, each in its own process group, logged to files."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.running: list[tuple[str, subprocess.Popen[bytes]]] = []

    def run(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=EXAMPLE, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"manage.py {args[0]} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def start(self, name: str, *cmd: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, *cmd], cwd=EXAMPLE, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.running.append((name, proc))
        return proc

    def stop(self, name: str | None = None) -> None:
        for label, proc in reversed(self.running):
            if (name is None or label == name) and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def tail(self) -> str:
        return "\n".join(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:]
                         for path in sorted(self.logs.glob("*.log")))


@pytest.fixture
def procs(tmp_path: Path, redis_server: Any) -> Iterator[Procs]:
    # Database 7 of the throwaway server: the example uses the default key
    # prefix and Celery's own keys, kept apart from the other tests' data.
    redis_url = f"redis://{redis_server.host}:{redis_server.port}/7"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="proj.settings", REDIS_URL=redis_url,
               DATABASE_URL=f"sqlite:///{tmp_path / 'e2e.sqlite3'}", PYTHONUNBUFFERED="1",
               # Retries after 1 s, so a failing target shows more than one attempt.
               ZSCHED_RETRY_BASE_S="1")
    env.pop("E2E_OUT", None)
    running = Procs(env, tmp_path)
    try:
        yield running
    finally:
        running.stop()
        redis.Redis.from_url(redis_url).flushdb()


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30,
                  host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {host}:{port}")


def test_imported_jobs_fire_and_their_runs_show_in_the_admin(procs: Procs,
                                                             tmp_path: Path) -> None:
    started = time.monotonic()
    port = free_port()
    # One site per job: runserver's 127.0.0.1 and three hosts of serve_targets.
    hosts = {"feed": "127.0.0.10", "error": "127.0.0.11", "ratelimited": "127.0.0.2"}
    jobs = [
        {"url": f"http://127.0.0.1:{port}/targets/feed/1.xml", "name": "Feed 1",
         "interval_s": 2, "meta": {"feed": 1}},
        {"url": f"http://{hosts['feed']}:{port}/targets/feed/2.xml", "name": "Feed 2",
         "interval_s": 3},
        {"url": f"http://{hosts['error']}:{port}/targets/error/3.xml", "name": "Broken feed 3",
         "interval_s": 2, "retry_max": 1},
        {"url": f"http://{hosts['ratelimited']}:{port}/targets/ratelimited/4.xml",
         "name": "Rate-limited feed 4", "interval_s": 2},
    ]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))

    procs.run("migrate", "--noinput", "-v", "0")
    assert "create: 4" in procs.run("zsched_import", "--file", str(jobs_file))
    runserver = procs.start("runserver", "manage.py", "runserver", f"127.0.0.1:{port}",
                            "--noreload")
    wait_for_port(port, runserver)
    targets = procs.start("targets", "manage.py", "serve_targets", "--port", str(port),
                          "--hosts", *hosts.values())
    for host in hosts.values():
        wait_for_port(port, targets, host=host)
    procs.start("worker", "-m", "celery", "-A", "proj", "worker", "-l", "info", "-P", "threads",
                "-c", "4", "--without-gossip", "--without-mingle", "--without-heartbeat")
    procs.start("beat", "-m", "celery", "-A", "proj", "beat", "-S", "celery_zsched", "-l",
                "info", "-s", str(tmp_path / "beat-schedule"))

    store = Store.from_settings(Settings(redis_url=procs.env["REDIS_URL"]))
    deadline = time.monotonic() + 60
    waiting = time.monotonic()
    totals: dict[str, int] = {}
    while time.monotonic() < deadline:
        stats = store.stats()
        totals = {k: v for k, v in stats.items() if k.startswith("total_")}
        # Both feeds twice, the two failing targets at least once each, and the
        # rate-limited site's 429 counted under its own domain by the pacing.
        limited_site = store.domain(hosts["ratelimited"])
        if (totals.get("total_complete", 0) >= 4 and totals.get("total_error", 0) >= 2
                and limited_site.throttled_429 >= 1):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"jobs did not fire in time: {totals}\n{procs.tail()}")
    fired = time.monotonic() - waiting
    # A site's trouble stays its own: the healthy feed's domain has completed
    # runs and no 429 of the rate-limited one.
    feed_site = store.domain(hosts["feed"])
    assert feed_site.completed >= 1 and feed_site.throttled_429 == 0, feed_site
    procs.stop("beat")
    procs.stop("worker")
    store.client.close()

    drained = procs.run("zsched_drain")
    procs.env["E2E_OUT"] = str(tmp_path / "pages.json")
    procs.run("shell", "-v", "0", "-c", ADMIN_PAGES)
    pages: dict[str, Any] = json.loads((tmp_path / "pages.json").read_text())

    assert {page["status"] for page in pages.values()} == {200}
    feed = pages["feed/1.xml"]
    assert feed["runs"] >= 2, drained
    assert feed["html"].count('class="zsched-badge zsched-complete"') >= 2
    broken = pages["error/3.xml"]
    assert broken["runs"] >= 1 and "JobFailed: HTTP 500 from" in broken["html"]
    limited = pages["ratelimited/4.xml"]
    assert limited["runs"] >= 1 and "HTTP 429 from" in limited["html"]
    print(f"\nexample project end to end in {time.monotonic() - started:.1f}s "
          f"(runs for {fired:.1f}s): {totals}; "
          f"runs per job: { {k: v['runs'] for k, v in pages.items()} }")
