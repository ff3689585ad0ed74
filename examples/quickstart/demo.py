"""One-command demo: Redis, a local scrape target, a worker, beat and a few jobs.

    python examples/quickstart/demo.py [--seconds 75]

It starts a throwaway redis-server on a free port (never your own Redis), an
HTTP target on 127.0.0.1, `celery worker` and `celery -S celery_zsched beat`,
adds jobs of every kind, and prints what fired and when.
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
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis

from celery_zsched import Job, Settings, Store

HERE = Path(__file__).resolve().parent
PREFIX = "{demo}:"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Target(BaseHTTPRequestHandler):
    """/feed/N answers 200, /flaky 500, /busy 429 with Retry-After: 2."""

    def do_GET(self) -> None:
        if self.path.startswith("/flaky"):
            self.send_response(500)
        elif self.path.startswith("/busy"):
            self.send_response(429)
            self.send_header("Retry-After", "2")
        else:
            self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<rss>demo</rss>")

    def log_message(self, *args: object) -> None:
        pass


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=HERE, start_new_session=True)


def follow(path: Path, stop: threading.Event, t0: float) -> None:
    """Print job_complete / job_error / job_retry events as they are logged."""
    while not path.exists() and not stop.is_set():
        time.sleep(0.1)
    with path.open() as fp:
        while not stop.is_set():
            line = fp.readline()
            if not line:
                time.sleep(0.1)
                continue
            for event in ("job_complete", "job_error"):
                if f"] {event} " in line:
                    data = json.loads(line.split(f"] {event} ", 1)[1])
                    nxt = data.get("next_run_at")
                    when = (datetime.fromtimestamp(nxt / 1000).strftime("%H:%M:%S")
                            if nxt else "-")
                    print(f"{time.time() - t0:6.1f}s  {event:<12} {data['job_id']:<14} "
                          f"attempt={data['attempt']} status={data['status']:<9} "
                          f"lateness={data['lateness_ms']}ms duration={data['duration_ms']}ms "
                          f"next={when}"
                          + (f"  error={data['error']}" if data.get("error") else ""),
                          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=75.0)
    args = parser.parse_args()
    server_bin = shutil.which("redis-server")
    if not server_bin:
        print("redis-server is not installed (apt-get install redis-server)", file=sys.stderr)
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="zsched-demo-"))
    redis_port, http_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    procs.append(subprocess.Popen([server_bin, "--port", str(redis_port), "--save", "",
                                   "--appendonly", "no", "--dir", str(workdir)],
                                  stdout=subprocess.DEVNULL))
    httpd = ThreadingHTTPServer(("127.0.0.1", http_port), Target)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"redis://127.0.0.1:{redis_port}/0"
    client = redis.Redis.from_url(url, decode_responses=True)
    for _ in range(50):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)

    settings = Settings(redis_url=url, key_prefix=PREFIX, retry_base_s=1.0,
                        default_task="demo_app.scrape")
    store = Store(client, settings, "Europe/Berlin")
    base = f"http://127.0.0.1:{http_port}"
    soon = datetime.now(timezone.utc) + timedelta(seconds=6)
    rows = [
        {"url": f"{base}/feed/1", "interval_s": 3, "meta": {"feed": 1}},
        {"url": f"{base}/feed/2", "interval_s": 5, "jitter_s": 1, "meta": {"feed": 2}},
        {"url": f"{base}/feed/3", "cron": "* * * * *", "timezone": "Europe/Berlin",
         "meta": {"feed": 3}},
        {"url": f"{base}/feed/once", "run_at": soon.isoformat(), "meta": {"feed": "once"}},
        {"url": f"{base}/flaky", "interval_s": 20, "retry_max": 2, "meta": {"feed": "flaky"}},
        {"url": f"{base}/busy", "interval_s": 30, "retry_max": 1, "meta": {"feed": "busy"}},
    ]
    jobs = [Job.from_dict(r, store.defaults) for r in rows]
    store.upsert_many(jobs, stagger=False)

    env = dict(os.environ, DEMO_BROKER_URL=url, ZSCHED_REDIS_URL=url, ZSCHED_KEY_PREFIX=PREFIX,
               ZSCHED_RETRY_BASE_S="1", PYTHONPATH=str(HERE))
    celery = str(Path(sys.executable).with_name("celery"))
    worker_log, beat_log = workdir / "worker.log", workdir / "beat.log"
    procs.append(start([celery, "-A", "demo_app", "worker", "-l", "info", "-P", "threads",
                        "-c", "4", "--without-gossip", "--without-mingle",
                        "--without-heartbeat"], worker_log, env))
    procs.append(start([celery, "-A", "demo_app", "beat", "-S", "celery_zsched", "-l", "info",
                        "-s", str(workdir / "beat-schedule")], beat_log, env))
    print(f"redis {url}  target {base}  logs in {workdir}")
    for job in jobs:
        print(f"  job {job.id}  {job.kind:<8} {job.url}")
    print(f"watching for {args.seconds:.0f}s (Ctrl-C to stop)...\n")
    stop = threading.Event()
    t0 = time.time()
    threading.Thread(target=follow, args=(worker_log, stop, t0), daemon=True).start()
    try:
        time.sleep(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for proc in procs[1:]:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs[1:]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        totals = {k[6:]: v for k, v in store.stats().items() if k.startswith("total_")}
        print("\ndone. totals:", json.dumps(totals))
        procs[0].terminate()
        procs[0].wait(timeout=10)
        httpd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
