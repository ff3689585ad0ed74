"""The README's demo commands run on this checkout and show what they promise.

Each demo starts its own throwaway redis-server and every process it needs, and
stops them all when its ``--seconds`` are up; the tests check its output, and that
the Django demo's REST API answers the ``curl`` line it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    # The suite's own settings must not reach the demos' processes.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZSCHED_", "CELERY_", "REDIS_URL", "DJANGO_SETTINGS_MODULE"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        raise AssertionError(f"the demo did not stop by itself:\n{out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    return out


def test_the_quickstart_demo_fires_jobs_and_stops_cleanly() -> None:
    proc = subprocess.Popen([sys.executable, "examples/quickstart/demo.py", "--seconds", "12"],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = _finish(proc, 90)
    assert re.search(r"job_complete .* status=complete", out), out[-3000:]
    assert re.search(r"job_error .* status=retrying", out), out[-3000:]


def test_the_django_demo_serves_the_admin_the_jobs_and_the_rest_api(tmp_path: Path) -> None:
    port = free_port()
    env = _env(DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}")
    proc = subprocess.Popen(
        [sys.executable, "example_project/demo.py", "--no-install", "--seconds", "30",
         "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    api: str | None = None
    deadline = time.monotonic() + 120
    while api is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if match := re.search(r"'(http://127\.0\.0\.1:\d+/v1/jobs\?[^']*)'", line):
            api = match.group(1)
    assert api is not None, "".join(lines)[-3000:]
    read_token = re.search(r"Bearer (\S+)'", "".join(lines))
    assert read_token is not None
    res = httpx.get(api, headers={"Authorization": f"Bearer {read_token.group(1)}"},
                    timeout=10)
    assert res.status_code == 200, res.text
    assert res.json()["items"], "the sample jobs are listed"
    rest = _finish(proc, 90)
    out = "".join(lines) + rest
    assert f"http://127.0.0.1:{port}/admin/" in out
    assert re.search(r"jobs=1002 .* complete=[1-9]", out), out[-3000:]
    assert "stopped" in out.splitlines()[-1]
