"""The whole Django demo in one command, on a machine that just cloned the repo.

    python example_project/demo.py [--port 8000] [--seconds N] [--no-install]

1. Installs celery-zsched with the ``django`` and ``server`` extras (editable, from this
   checkout) and ``celery[redis]`` (the example's broker) into the active
   virtualenv; outside a virtualenv it creates ``example_project/.venv`` and
   installs there (never into the system Python). Skipped when everything is
   already importable from this checkout.
2. Uses ``REDIS_URL`` if set; otherwise starts a throwaway ``redis-server`` on a
   free port (``--save ""``, nothing written to disk, never your own Redis).
3. Migrates the SQLite database (``example_project/db.sqlite3``, or
   ``DATABASE_URL``), creates the superuser admin/admin, imports the 1,000
   sample jobs with ``manage.py zsched_import`` and reconciles Redis.
4. Starts ``runserver 127.0.0.1:8000`` (the admin), ``manage.py
   serve_targets`` (the fake sites the jobs fetch, on 127.0.0.2, .3 and
   .10-.33, port 8000: each host is one domain to the per-domain pacing), a
   Celery worker, ``celery beat -S celery_zsched`` and ``zsched serve`` (the
   REST API, writing the admin's rows), prints where to log in,
   how to watch the domains, and a status line every 15 s. Ctrl-C stops
   everything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEMO_VENV = HERE / ".venv"
NEEDED = ("celery_zsched", "django", "django_redis", "cron_descriptor", "celery", "redis",
          "packaging", "fastapi", "uvicorn")
STATUS_EVERY_S = 15.0


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


# ---------------------------------------------------------------- install
CHECK = f"""
import importlib.util, sys
from pathlib import Path
if any(importlib.util.find_spec(name) is None for name in {NEEDED!r}):
    sys.exit(1)
spec = importlib.util.find_spec("celery_zsched.contrib.django")
sys.exit(0 if spec and Path(spec.origin).resolve().is_relative_to({str(REPO)!r}) else 1)
"""


def installed(python: Path) -> bool:
    """Whether ``python`` imports every dependency, and celery-zsched from this checkout."""
    return subprocess.run([str(python), "-c", CHECK], capture_output=True).returncode == 0


def ensure_installed(args: argparse.Namespace) -> None:
    """Install into a virtualenv, then re-run this script there (``--no-install``)."""
    in_venv = sys.prefix != sys.base_prefix
    python = Path(sys.executable)
    if not in_venv:
        python = DEMO_VENV / "bin" / "python"
        if not python.exists():
            say(f"not in a virtualenv: creating {DEMO_VENV}")
            venv.EnvBuilder(with_pip=True).create(DEMO_VENV)
    if installed(python):
        say(f"celery-zsched[django,server] already installed in {python.parent.parent}")
    else:
        say(f"installing celery-zsched[django,server] from {REPO} into {python.parent.parent}")
        # celery[redis]: the example's broker is Redis, and kombu's Redis
        # transport needs that extra (it imports packaging).
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[django,server]",
                        "celery[redis]"], check=True)
    # A fresh interpreter: an editable install is only importable after a restart.
    argv = [str(python), str(Path(__file__).resolve()), "--no-install", *sys.argv[1:]]
    os.execv(str(python), argv)


# -------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path | None = None,
                  timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while not port_busy(port, host):
        if proc.poll() is not None or time.monotonic() > deadline:
            detail = f"; see {log}" if log else ""
            raise SystemExit(f"[demo] {what} did not start{detail}")
        time.sleep(0.1)


class Processes:
    """Child processes, each in its own session, stopped in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], log: Path | None, env: dict[str, str]
              ) -> subprocess.Popen[bytes]:
        out: Any = log.open("wb") if log else subprocess.DEVNULL
        # start_new_session: Ctrl-C reaches only this script, which then stops
        # the children in order (beat first, so nothing new is published).
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=HERE,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                say(f"stopping {name}")
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=HERE, env=env, check=True)


CREATE_ADMIN = """
from django.contrib.auth import get_user_model
User = get_user_model()
user, created = User.objects.get_or_create(username="admin",
                                           defaults={"email": "admin@example.com"})
user.is_staff = user.is_superuser = True
user.set_password("admin")
user.save()
print("[demo] superuser admin/admin", "created" if created else "reset")
"""


def status_line(store: Any) -> str:
    stats = store.stats()
    alerts = store.domain_alerts()
    # The sites pacing holds back now, by name: the rate-limited one (127.0.0.2)
    # while its Retry-After gate is shut, the flaky one (127.0.0.3) while its
    # breaker is open.
    flagged = "".join(f" {kind}={','.join(names)}" for kind, names in alerts.items() if names)
    return (f"{time.strftime('%H:%M:%S')}  jobs={stats['jobs']} scheduled={stats['scheduled']} "
            f"in_flight={stats['in_flight']} paused={stats['paused']} dead={stats['dead']} "
            f"due_next_minute={stats['due_next_minute']}  "
            f"complete={stats.get('total_complete', 0)} error={stats.get('total_error', 0)}"
            f"{flagged}")


def run(args: argparse.Namespace) -> int:
    import redis
    from scrapers.hosts import FEED_HOSTS, FLAKY_HOST, RATELIMITED_HOST, host_for

    from celery_zsched import Settings, Store

    if port_busy(args.port):
        say(f"port {args.port} is busy: stop what runs there or pass --port")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="zsched-django-demo-"))
    procs = Processes()
    redis_url = os.environ.get("REDIS_URL", "")
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C must stop the demo even when started from a shell that set SIGINT
    # to "ignore" (a background job), which the exec'd interpreter inherits.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not redis_url:
            server = shutil.which("redis-server")
            if not server:
                say("redis-server is not installed (apt-get install redis-server), "
                    "or set REDIS_URL")
                return 2
            port = free_port()
            cmd = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(workdir)]
            proc = procs.start("redis-server", cmd, workdir / "redis.log", dict(os.environ))
            wait_for_port(port, proc, "redis-server", workdir / "redis.log")
            redis_url = f"redis://127.0.0.1:{port}/0"
            say(f"throwaway redis-server at {redis_url}")
        env = dict(os.environ, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="proj.settings",
                   PYTHONUNBUFFERED="1")

        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "shell", "-v", "0", "-c", CREATE_ADMIN)
        jobs_file = HERE / "sample_jobs.json"
        if args.port != 8000:
            # The sample points at :8000; write a copy that points at --port.
            from make_sample_jobs import sample_jobs

            jobs_file = workdir / "sample_jobs.json"
            jobs_file.write_text(json.dumps(sample_jobs(args.port)))
        say(f"importing {jobs_file.name}")
        manage(env, "zsched_import", "--file", str(jobs_file))
        # A second run of the demo finds the rows in the database (the import
        # skips them) but a new, empty Redis: reconcile pushes them there.
        manage(env, "zsched_sync", "-v", "0")

        runserver = procs.start(
            "runserver", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{args.port}",
                          "--noreload"], workdir / "runserver.log", env)
        wait_for_port(args.port, runserver, "runserver", workdir / "runserver.log")
        targets = procs.start("targets", [sys.executable, "manage.py", "serve_targets",
                                          "--port", str(args.port)], workdir / "targets.log", env)
        wait_for_port(args.port, targets, "serve_targets", workdir / "targets.log",
                      host=FEED_HOSTS[-1])
        celery = [sys.executable, "-m", "celery", "-A", "proj"]
        procs.start("worker", [*celery, "worker", "-l", "info", "-P", "threads", "-c", "16",
                               "--without-gossip", "--without-mingle", "--without-heartbeat"],
                    workdir / "worker.log", env)
        procs.start("beat", [*celery, "beat", "-S", "celery_zsched", "-l", "info",
                             "-s", str(workdir / "beat-schedule")], workdir / "beat.log", env)
        api_port = free_port()
        api = procs.start("api", [*celery, "zsched", "serve", "--port", str(api_port),
                                  "--log-level", "warning"], workdir / "api.log", env)
        wait_for_port(api_port, api, "zsched serve", workdir / "api.log")

        base = f"http://127.0.0.1:{args.port}"
        own = "" if "REDIS_URL" in os.environ else "  (throwaway: gone when the demo stops)"
        domains = (f"cd {HERE} && REDIS_URL={redis_url} "
                   f"{sys.executable} -m celery -A proj zsched domains")
        print(f"""
  celery-zsched demo is running

  admin     {base}/admin/zsched/zschedjob/   log in as  admin / admin
  targets   http://{host_for("feed", 1)}:{args.port}/targets/feed/1.xml  (also slow/, error/;
            healthy sites {FEED_HOSTS[0]}-{FEED_HOSTS[-1]}, rate-limited {RATELIMITED_HOST},
            flaky {FLAKY_HOST}: down (503) at first, then it recovers)
  domains   {base}/admin/zsched/zschedjob/domains/
            or  {domains}
  REST API  curl -H 'Authorization: Bearer demo-read-token-00001' \\
                 'http://127.0.0.1:{api_port}/v1/jobs?limit=3&status=scheduled'
            (writes: demo-write-token-0001; it writes the admin's rows)
  redis     {redis_url}{own}
  logs      {workdir}/{{runserver,targets,worker,beat,api}}.log

  Run history reaches the admin every 15 s (the drain_history task).
  Ctrl-C stops everything.
""", flush=True)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        store = Store(client, Settings(redis_url=redis_url))
        started = time.monotonic()
        while args.seconds is None or time.monotonic() - started < args.seconds:
            for name, proc in procs.procs:
                if proc.poll() is not None:
                    say(f"{name} exited with {proc.returncode}; see {workdir}/{name}.log")
                    return 1
            time.sleep(min(STATUS_EVERY_S, args.seconds or STATUS_EVERY_S))
            print("  " + status_line(store), flush=True)
        return 0
    except KeyboardInterrupt:
        stopping = True
        print()
        return 0
    except subprocess.CalledProcessError as exc:
        say(f"failed: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip cleanup
        procs.stop()
        say("stopped" + (" (interrupted)" if stopping else "") + f"; logs kept in {workdir}")


def main() -> int:
    """Parse arguments, install if needed, then run the demo until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8000,
                        help="runserver port; the sample jobs point at it (default 8000)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop by itself after this many seconds (default: run until Ctrl-C)")
    parser.add_argument("--no-install", action="store_true",
                        help="use this interpreter as it is; install nothing")
    args = parser.parse_args()
    if not args.no_install:
        ensure_installed(args)  # re-executes this script; does not return
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
