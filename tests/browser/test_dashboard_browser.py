"""The dashboard, the dead-letter view and the next-fires preview in a real headless Chromium.

The dashboard's charts must draw (every SVG and its bars have a real size on
the page), with no console error and no request to anything but the test
server. Screenshots of the three pages go to ``artifacts/``, and to
``docs/screenshots/`` for the README when a file there is missing or
``ZSCHED_UPDATE_SCREENSHOT=1``.
"""

from __future__ import annotations

import os
import random
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.browser.conftest import CHROMIUM, log_in
from tests.dead_letters import dead_job, kill
from tests.helpers import settle_all

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
HOUR_MS = 3_600_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium "
                              "(apt-get install chromium)"),
]


class Watched:
    """A Chromium page that records console errors and every URL it requests."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("request", lambda request: self.requests.append(request.url))

    def _console(self, msg: Any) -> None:
        # Chromium asks for /favicon.ico on its own; the admin has none (404).
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            self.errors.append(f"{msg.text} ({msg.location.get('url')})")


@pytest.fixture
def watched(page: Any) -> Watched:
    """The browser conftest's Chromium page, watched from its first request."""
    return Watched(page)


@pytest.fixture
def fleet(settings: Any, zsched_redis: None) -> Store:
    """A store with a day of due load, paused jobs, dead letters, a throttled domain
    and an open breaker; and a day of run history with a lateness spike."""
    settings.CELERY_ZSCHED_LEASE_S = 0.05
    settings.CELERY_ZSCHED_MAX_DELIVERIES = 1
    store = conf.get_store()
    errors = ["HTTP 503: upstream down", "TimeoutError: read timed out after 30 s",
              "WorkerLostError: worker exited with signal 9 (SIGKILL)"]
    for n, error in enumerate(errors * 2):
        kill(store, [dead_job(f"dead{n}", name=f"Sitemap crawl {n}",
                              url=f"https://shop{n}.example/sitemap.xml")], error=error)
    # Pacing on (a new store): one domain throttled by a Retry-After, one breaker open.
    settings.CELERY_ZSCHED_PACING = True
    settings.CELERY_ZSCHED_DOMAIN_DELAY_S = 0
    settings.CELERY_ZSCHED_DOMAIN_MAX_IN_FLIGHT = 0
    settings.CELERY_ZSCHED_BREAKER_MIN_REQUESTS = 2
    store = conf.get_store()
    settle_all(store, "api.ratelimited.example", 1, "error", 429, retry_after_s=900)
    settle_all(store, "down.example", 3, "error", 500)
    # The fleet last: the claims above would have taken its overdue jobs.
    rng = random.Random(12)
    now = store.now_ms()
    jobs: list[Job] = []
    due: dict[str, int | None] = {}
    for n in range(600):
        job = Job.from_dict({"id": f"feed{n:04d}", "task": "scrape", "interval_s": 86400,
                             "url": f"https://news{n % 40}.example/feed/{n}.xml"})
        jobs.append(job)
        # A daily curve, and a few overdue (beat is behind).
        hours = rng.uniform(-1, 0) if n % 50 == 0 else rng.triangular(0, 24, 9)
        due[job.id] = now + int(hours * HOUR_MS)
    store.upsert_many(jobs, first_due=due)
    store.pause(*(job.id for job in jobs[:45]))
    _history()
    return store


def _history() -> None:
    rng = random.Random(3)
    now = timezone.now()
    rows = []
    for n in range(6000):
        ago = rng.uniform(0, 24 * 3600)
        spike = 8 * 3600 < ago < 10 * 3600  # two slow hours, eight to ten hours ago
        status = rng.choices(["complete", "retrying", "error", "skipped"],
                             [90, 5, 4 + (20 if spike else 0), 1])[0]
        rows.append(ZSchedRun(
            job_id=f"feed{n % 600:04d}", occurrence=n, status=status,
            finished_at=now - timedelta(seconds=ago), stream_id=f"h-{n}",
            lateness_ms=int(rng.lognormvariate(5.5 if spike else 4, 0.8))))
    ZSchedRun.objects.bulk_create(rows, batch_size=1000)


def keep(artifacts: Path, name: str) -> None:
    """Copy a screenshot to docs/screenshots/ (missing there, or on request)."""
    target = SCREENSHOTS / name
    if os.environ.get("ZSCHED_UPDATE_SCREENSHOT") == "1" or not target.exists():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifacts / name, target)


def test_the_dashboard_draws_its_charts_from_the_server_alone(
        watched: Watched, live_server: Any, admin_user: Any, fleet: Store,
        artifacts: Path) -> None:
    page = watched.page
    admin = f"{live_server.url}/admin/"
    log_in(watched.page, admin)

    # From the job list, as an operator finds it.
    page.goto(admin + "zsched/zschedjob/")
    page.click("#toggle-nav-sidebar")  # the sidebar folds away: charts get the width
    watched.requests.clear()
    page.click(".object-tools a:text('Dashboard')")
    page.wait_for_selector("svg.zsched-chart")

    # Due load, freshness (the sampled recrawl intervals), states, lateness, outcomes.
    charts = page.locator("svg.zsched-chart")
    assert charts.count() == 5
    assert page.locator("#zsched-freshness svg.zsched-chart").count() == 1
    for i in range(5):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 150
    bars = page.locator("#zsched-due svg rect.bar")
    assert bars.count() == 49
    heights = [bars.nth(i).bounding_box() for i in range(49)]
    assert sum(1 for b in heights if b and b["height"] > 0) > 40
    assert page.locator("#zsched-lateness svg circle.point").count() >= 40
    assert page.locator("#zsched-dead-count").inner_text() == "6"
    domains = page.locator("#zsched-domains").inner_text()
    assert "api.ratelimited.example" in domains and "down.example" in domains
    hover = page.locator("#zsched-due svg rect.bar title").first.text_content()
    assert hover is not None and "overdue" in hover

    assert watched.errors == []
    outside = [url for url in watched.requests if not url.startswith(live_server.url)]
    assert outside == []
    page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
    keep(artifacts, "dashboard.png")

    # The dead-letter count links to the dead-letter view.
    page.click("#zsched-states a:text('Dead letters')")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 6
    page.screenshot(path=str(artifacts / "dead-letters.png"), full_page=True)
    keep(artifacts, "dead-letters.png")
    assert watched.errors == []


def test_the_job_page_previews_its_next_fires(
        watched: Watched, live_server: Any, admin_user: Any, zstore: Store,
        artifacts: Path) -> None:
    page = watched.page
    admin = f"{live_server.url}/admin/"
    row = ZSchedJob.objects.create(name="Morning digest",
                                   url="https://www.heise.example/digest.xml",
                                   cron="30 8 * * 1-5", timezone="Europe/Berlin")
    log_in(watched.page, admin)
    page.goto(admin + f"zsched/zschedjob/{row.pk}/change/")
    page.click("#toggle-nav-sidebar")
    fires = page.locator("#zsched-next-fires tbody tr")
    assert fires.count() == 10
    page.wait_for_load_state("networkidle")  # the live preview may redraw once on load
    assert "08:30:00" in fires.first.inner_text()
    # The Timing section, from its title to the next-fires table (page coordinates).
    clip = page.evaluate("""() => {
        const top = document.querySelector("#zsched-next-fires").closest("fieldset")
            .getBoundingClientRect();
        const end = document.querySelector(".field-next_fires").getBoundingClientRect();
        return {x: top.left + window.scrollX, y: top.top + window.scrollY,
                width: top.width, height: end.bottom - top.top};
    }""")
    page.screenshot(path=str(artifacts / "next-fires.png"), full_page=True, clip=clip)
    keep(artifacts, "next-fires.png")

    # Edit the timing: the live preview redraws from the server's answer.
    page.fill("#id_cron", "*/20 * * * *")
    page.locator("#id_cron").dispatch_event("input")
    page.wait_for_function(
        "document.querySelector('#zsched-next-fires tbody td')"
        " && /:(00|20|40):00/.test(document.querySelector('#zsched-next-fires tbody td')"
        ".textContent) && !document.querySelector('#zsched-next-fires').textContent"
        ".includes('08:30:00')")
    assert fires.count() == 10
    assert watched.errors == []
    outside = [url for url in watched.requests if not url.startswith(live_server.url)]
    assert outside == []
