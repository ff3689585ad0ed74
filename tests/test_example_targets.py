"""The example project's fake sites and its scrape task, against a real server.

``manage.py serve_targets`` serves the example's views on loopback hosts of
their own (127.0.0.2 rate-limited, 127.0.0.3 flaky, 127.0.0.10 healthy), the
way the demo does; the task ``scrapers.tasks.scrape`` is called in this
process and fetches from them over real HTTP. What the sites answer, and the
status and Retry-After the task hands to pacing, are checked here; what the
scheduler does with them is the core's tests' business.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from celery.signals import task_success

from celery_zsched.core.errors import JobFailed
from tests.helpers import free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "example_project"
RATELIMITED, FLAKY, HEALTHY = "127.0.0.2", "127.0.0.3", "127.0.0.10"
#: The flaky site's downtime in these tests: long enough to see it fail, short
#: enough to wait out.
FLAKY_FOR_S = 3.0

pytestmark = pytest.mark.slow  # starts a Django server process

# The example's modules (scrapers.tasks, make_sample_jobs) import as the
# example's own scripts do: from its directory.
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from scrapers.tasks import retry_after_s, scrape  # noqa: E402


class Sites:
    """A running ``serve_targets``: URLs of its targets, and when it listened."""

    def __init__(self, port: int, listening: float) -> None:
        self.port, self.listening = port, listening

    def wait_out_flaky(self) -> None:
        # The flaky site counts from its module's import, which comes before
        # the sockets listen: FLAKY_FOR_S after listening it is up for sure.
        time.sleep(max(0.0, self.listening + FLAKY_FOR_S + 0.2 - time.monotonic()))

    def url(self, host: str, kind: str, n: int = 1) -> str:
        return f"http://{host}:{self.port}/targets/{kind}/{n}.xml"


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    """A fresh server per test: the rate-limited site counts requests and the
    flaky one its uptime, both from the process start."""
    port = free_port()
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="proj.settings", PYTHONUNBUFFERED="1",
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
               SCRAPERS_FLAKY_S=str(FLAKY_FOR_S))
    log = (tmp_path / "targets.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve_targets", "--port", str(port),
         "--hosts", RATELIMITED, FLAKY, HEALTHY],
        cwd=EXAMPLE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not all(_listening(host, port) for host in (RATELIMITED, FLAKY, HEALTHY)):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("serve_targets did not start:\n"
                            + (tmp_path / "targets.log").read_text(errors="replace"))
            time.sleep(0.05)
        yield Sites(port, time.monotonic())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _get(url: str) -> tuple[int, str | None]:
    """Status and Retry-After header of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After")


def _scrape(url: str) -> tuple[dict[str, int], Any]:
    """Run the task as a worker would (eagerly, signals and all): its result and
    the outcome it reported with ``report()``, read where the worker reads it."""
    seen: list[Any] = []

    def on_success(sender: Any = None, **_: Any) -> None:
        seen.append(getattr(sender.request, "zsched_outcome", None))

    task_success.connect(on_success, sender=scrape, weak=False)
    try:
        result = scrape.apply(args=[url], throw=True)
    finally:
        task_success.disconnect(on_success, sender=scrape)
    assert len(seen) == 1
    return result.get(), seen[0]


def _failure(url: str) -> JobFailed:
    with pytest.raises(JobFailed) as caught:
        scrape(url)
    return caught.value


def test_the_sites_answer_as_the_readme_says(sites: Sites) -> None:
    assert _get(sites.url(HEALTHY, "feed")) == (200, None)
    assert _get(sites.url(HEALTHY, "error")) == (500, None)
    # Every other request to the rate-limited site is a 429 with Retry-After: 10.
    answers = [_get(sites.url(RATELIMITED, "ratelimited", n)) for n in range(1, 7)]
    assert answers == [(200, None), (429, "10")] * 3
    # The flaky site is down (503, no Retry-After) until FLAKY_FOR_S after its
    # start, then up for good.
    assert _get(sites.url(FLAKY, "flaky")) == (503, None)
    sites.wait_out_flaky()
    assert [_get(sites.url(FLAKY, "flaky", n)) for n in range(3)] == [(200, None)] * 3


def test_scrape_reports_statuses_and_retry_after(sites: Sites) -> None:
    result, outcome = _scrape(sites.url(HEALTHY, "feed"))
    assert result["status"] == 200 and result["bytes"] > 0
    # report("complete", status=200): (outcome, error, retry_after, status).
    assert outcome is not None and outcome[0] == "complete" and outcome[3] == 200

    broken = _failure(sites.url(HEALTHY, "error"))
    assert (broken.status, broken.retry_after) == (500, None)
    assert str(broken).startswith("HTTP 500 from ")

    # First request 200, second 429 with Retry-After: 10, handed on as seconds.
    assert _scrape(sites.url(RATELIMITED, "ratelimited"))[0]["status"] == 200
    limited = _failure(sites.url(RATELIMITED, "ratelimited"))
    assert (limited.status, limited.retry_after) == (429, 10.0)

    down = _failure(sites.url(FLAKY, "flaky"))
    assert (down.status, down.retry_after) == (503, None)
    sites.wait_out_flaky()
    assert _scrape(sites.url(FLAKY, "flaky"))[0]["status"] == 200


def test_retry_after_seconds_and_dates() -> None:
    assert retry_after_s("10") == 10.0
    assert retry_after_s(" 2.5 ") == 2.5
    assert retry_after_s("-3") == 0.0  # nonsense, but never a negative wait
    in_a_minute = retry_after_s(formatdate(time.time() + 60, usegmt=True))
    assert in_a_minute is not None and 55 <= in_a_minute <= 61
    assert retry_after_s(formatdate(time.time() - 60, usegmt=True)) == 0.0
    for unusable in (None, "", "soon", "nan", "inf"):
        assert retry_after_s(unusable) is None


def test_sample_jobs_spread_over_the_sites() -> None:
    import json

    from make_sample_jobs import sample_jobs
    from scrapers.hosts import FEED_HOSTS, FLAKY_HOST, RATELIMITED_HOST

    rows = sample_jobs()
    # The checked-in file is what the script writes.
    assert json.loads((EXAMPLE / "sample_jobs.json").read_text()) == rows
    hosts_of: dict[str, set[str]] = {}
    for row in rows:
        host = row["url"].split("/")[2].split(":")[0]
        hosts_of.setdefault(row["meta"]["target"], set()).add(host)
    assert hosts_of["ratelimited"] == {RATELIMITED_HOST}
    assert hosts_of["flaky"] == {FLAKY_HOST}
    for kind in ("feed", "slow", "error"):
        assert hosts_of[kind] <= set(FEED_HOSTS), kind
    assert hosts_of["feed"] == set(FEED_HOSTS)
    assert all(row["url"].split("/")[2].endswith(":8000") for row in rows)
    assert all(row["url"].split("/")[2].endswith(":9123") for row in sample_jobs(9123, 50))


def test_the_feed_honours_conditional_requests_and_the_task_reports_a_304(
        sites: Sites) -> None:
    from celery_zsched.worker.validators import HEADERS

    url = sites.url(HEALTHY, "feed")
    result, outcome = _scrape(url)
    assert result["status"] == 200
    with urllib.request.urlopen(url, timeout=10) as resp:
        etag, modified = resp.headers["ETag"], resp.headers["Last-Modified"]
    assert _get_with(url, {"If-None-Match": etag}) == 304
    assert _get_with(url, {"If-Modified-Since": modified}) == 304
    assert _get_with(url, {"If-None-Match": '"another"'}) == 200
    # The task sends the validators its message carries, and reports the 304.
    headers = {HEADERS["etag"]: etag, HEADERS["last_modified"]: modified}
    seen: list[Any] = []

    def on_success(sender: Any = None, **_: Any) -> None:
        seen.append((sender.request.zsched_outcome, sender.request.zsched_visit))

    task_success.connect(on_success, sender=scrape, weak=False)
    try:
        again = scrape.apply(args=[url], headers=headers, throw=True).get()
    finally:
        task_success.disconnect(on_success, sender=scrape)
    assert again == {"status": 304, "bytes": 0}
    (outcome, visit), = seen
    assert outcome[0] == "complete" and outcome[3] == 304 and visit.changed is False


def _get_with(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
