"""Issue 12 in a real headless Chromium: the job list and the run history fit
1,400 px with the navigation sidebar open, and the add form says a cron in
words as it is typed.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from celery_zsched.contrib.django.history import drain
from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store import Store
from tests.browser.conftest import CHROMIUM, log_in
from tests.browser.test_admin_browser import seed_fleet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium"),
]

#: Widths of the page and of the results table: the box and what it holds.
WIDTHS = """() => {
  const d = document.documentElement, results = document.querySelector(".results");
  return {page: [d.scrollWidth, d.clientWidth],
          results: [results.scrollWidth, results.clientWidth],
          nav: document.querySelector("#nav-sidebar").getBoundingClientRect().width};
}"""


def test_the_job_list_and_runs_fit_1400_px_with_the_sidebar_open(
        page: Any, live_server: Any, admin_user: Any, zstore: Store, artifacts: Path) -> None:
    seed_fleet(zstore)
    # The widest cells: a long name and URL, a one-off days ahead, a zone of three parts.
    ZSchedJob.objects.create(
        name="A rather long name for a scrape job of the regional statistics office",
        url="https://www.statistik-berlin-brandenburg.de/publikationen/statistische-berichte/"
            "2026/a-very-long-path-segment-without-any-breaks.xml",
        run_at=timezone.now() + timedelta(days=3))
    ZSchedJob.objects.create(name="Buenos Aires", url="https://a.example/ba",
                             cron="0 9 * * 1-5", timezone="America/Argentina/Buenos_Aires")
    # A run with every timing (seed_fleet's have none) on another day than today.
    row = ZSchedJob.objects.get(name="Tagesschau feed")
    zstore.run_now(row.job_id)
    claimed = next(c for c in zstore.claim().jobs if c.job.id == row.job_id)
    due = claimed.occurrence - 3 * 86_400_000
    zstore.settle(row.job_id, claimed.occurrence, claimed.attempt, "error",
                  error="TargetError: HTTP 503 from https://www.statistik-berlin-brandenburg.de/"
                        "publikationen/statistische-berichte/2026/a-long-path.xml",
                  event={"due_ms": due, "promoted_ms": due + 12_345, "started_ms": due + 98_765,
                         "lateness_ms": 12_345, "wait_ms": 86_420, "duration_ms": 23_456})
    drain()
    admin = f"{live_server.url}/admin/"
    log_in(page, admin)
    assert page.viewport_size["width"] == 1400
    page.goto(admin + "zsched/zschedjob/")
    assert page.locator("#nav-sidebar").is_visible()
    widths = page.evaluate(WIDTHS)
    assert widths["nav"] > 200  # open, not folded
    page.screenshot(path=str(artifacts / "admin-changelist-sidebar.png"), full_page=True)
    assert widths["page"][0] <= widths["page"][1], widths
    assert widths["results"][0] <= widths["results"][1], widths

    # The run history too (seed_fleet settled five runs, two with long errors; one more above).
    page.goto(admin + "zsched/zschedrun/")
    assert page.locator("#result_list tbody tr").count() == 6
    widths = page.evaluate(WIDTHS)
    page.screenshot(path=str(artifacts / "admin-runs-sidebar.png"), full_page=True)
    assert widths["page"][0] <= widths["page"][1], widths
    assert widths["results"][0] <= widths["results"][1], widths


def test_typing_a_cron_says_it_in_words_before_saving(
        page: Any, live_server: Any, admin_user: Any, zstore: Store) -> None:
    admin = f"{live_server.url}/admin/"
    log_in(page, admin)
    page.goto(admin + "zsched/zschedjob/add/")
    words = page.locator("#zsched-words")
    page.fill("#id_timezone", "America/New_York")
    page.fill("#id_cron", "*/15 * * * *")
    page.wait_for_function(
        "() => document.querySelector('#zsched-words').textContent"
        " === 'Every 15 minutes (America/New_York time)'")
    page.fill("#id_cron", "61 * * * *")
    page.wait_for_function(
        "() => document.querySelector('#zsched-words').textContent.includes(\"'61'\")")
    assert "is not in 0-59 for minutes" in words.inner_text()
    page.fill("#id_cron", "30 8 * * 1-5")
    page.wait_for_function(
        "() => document.querySelector('#zsched-words').textContent"
        " === 'At 08:30, Monday through Friday (America/New_York time)'")
    # A one-off: the date and time boxes are read in TIME_ZONE (Europe/Berlin), as
    # saving reads them, and said in the job's zone.
    page.fill("#id_cron", "")
    page.fill("#id_run_at_0", "2031-01-15")
    page.fill("#id_run_at_1", "09:30:00")
    page.wait_for_function(
        "() => document.querySelector('#zsched-words').textContent"
        " === 'Once, at 2031-01-15 03:30:00 EST (America/New_York)'")
    # The zone box suggests zones as they are typed, from a list in the page.
    assert page.locator("datalist#zsched-timezones option[value='Europe/Berlin']").count() == 1
    assert not ZSchedJob.objects.exists()  # nothing was saved
