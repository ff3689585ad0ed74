"""The job admin in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

A person's path through the admin: log in, enter a cron job with a bad
expression and read the error, fix it and read the next run, pause the job.
Screenshots go to ``artifacts/`` (gitignored); the changelist one is also
copied to ``docs/admin.png`` for the README when that file is missing or
``ZSCHED_UPDATE_SCREENSHOT=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store import Store
from tests.browser.conftest import CHROMIUM, log_in

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "admin.png"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium "
                              "(apt-get install chromium)"),
]


def seed_fleet(store: Store) -> None:
    """A few jobs with a history, so the changelist screenshot shows every badge."""
    base = "http://127.0.0.1:8000/targets"
    specs: list[dict[str, Any]] = [
        {"name": "Tagesschau feed", "url": f"{base}/feed/1.xml", "interval_s": 300},
        {"name": "Heise news", "url": f"{base}/feed/2.xml", "cron": "*/15 * * * *",
         "timezone": "Europe/Berlin"},
        {"name": "Weather Berlin", "url": f"{base}/slow/3.xml", "interval_s": 600,
         "jitter_s": 30, "queue": "slow"},
        {"name": "Broken upstream", "url": f"{base}/error/4.xml", "interval_s": 120,
         "retry_max": 0},
        {"name": "Rate-limited API", "url": f"{base}/ratelimited/5.xml", "interval_s": 60},
        {"name": "Morning digest", "url": f"{base}/feed/6.xml", "cron": "30 8 * * 1-5",
         "timezone": "Europe/Berlin"},
        {"name": "Archive crawl", "url": f"{base}/feed/7.xml", "interval_s": 3600,
         "enabled": False},
    ]
    rows = [ZSchedJob.objects.create(**spec) for spec in specs]  # on-commit pushes run now
    target = "http://127.0.0.1:8000/targets"
    outcomes = {0: ("complete", ""), 1: ("complete", ""), 2: ("complete", ""),
                3: ("error", f"TargetError: HTTP 500 from {target}/error/4.xml"),
                4: ("error", f"JobFailed: HTTP 429 from {target}/ratelimited/5.xml")}
    store.run_now(*(rows[i].job_id for i in outcomes))
    claimed = {c.job.id: c for c in store.claim().jobs}
    for index, (outcome, error) in outcomes.items():
        c = claimed[rows[index].job_id]
        store.settle(c.job.id, c.occurrence, c.attempt, outcome, error=error,
                     event={"duration_ms": 40 + 300 * index, "wait_ms": 4})
    drain()


def test_a_person_fixes_a_bad_cron_and_pauses_the_job(
        page: Any, live_server: Any, admin_user: Any, zstore: Store, artifacts: Path) -> None:
    seed_fleet(zstore)
    admin = f"{live_server.url}/admin/"

    # 1. Log in.
    log_in(page, admin)

    page.goto(admin + "zsched/zschedjob/")
    # The app sidebar folded away (remembered by the browser), so every column fits.
    page.click("#toggle-nav-sidebar")
    assert page.locator("#result_list tbody tr").count() == 7
    badges = page.locator("#result_list .zsched-badge")
    assert badges.count() == 7
    for status, count in (("complete", 3), ("error", 1), ("retrying", 1), ("none", 2)):
        assert page.locator(f"#result_list .zsched-{status}").count() == count
    page.screenshot(path=str(artifacts / "admin-changelist.png"), full_page=True)

    # 2. A cron job with a bad expression: the error sits on the cron field.
    page.goto(admin + "zsched/zschedjob/add/")
    page.fill("#id_name", "Berlin traffic")
    page.fill("#id_url", "http://127.0.0.1:8000/targets/feed/42.xml")
    page.fill("#id_cron", "61 * * * *")
    page.fill("#id_timezone", "Europe/Berlin")
    page.click("input[name=_continue]")
    error = page.locator(".field-cron .errorlist")
    error.wait_for()
    assert "'61' is not in 0-59 for minutes" in error.inner_text()
    page.screenshot(path=str(artifacts / "admin-bad-cron.png"), full_page=True)

    # 3. Fix it: the change page says when it runs next, in words and in time.
    page.fill("#id_cron", "*/15 * * * *")
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    words = page.locator(".field-schedule_words .readonly").inner_text()
    assert words == "Every 15 minutes (Europe/Berlin time)"
    next_run = page.locator(".field-next_run_detail .readonly").inner_text()
    assert next_run.startswith(("in ", "due now"))  # "due now": saved on a slot boundary
    job = ZSchedJob.objects.get(name="Berlin traffic")
    assert zstore.get(job.job_id).due_ms is not None
    page.screenshot(path=str(artifacts / "admin-change.png"), full_page=True)

    # 4. Pause it with the button: Redis, the row and the page all say so.
    page.click("button:text('Pause')")
    page.wait_for_selector(".messagelist .success:has-text('Paused 1 job')")
    assert page.locator(".field-next_run_detail .readonly").inner_text() == "paused"
    assert page.locator("button:text('Resume')").count() == 1
    assert zstore.get(job.job_id).paused
    job.refresh_from_db()
    assert not job.enabled
    page.screenshot(path=str(artifacts / "admin-paused.png"), full_page=True)

    # 5. The changelist screenshot is the README's picture. Refreshed only on
    # request, so a test run does not leave the committed file modified.
    if os.environ.get("ZSCHED_UPDATE_SCREENSHOT") == "1" or not DOCS_SCREENSHOT.exists():
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(artifacts / "admin-changelist.png", DOCS_SCREENSHOT)
