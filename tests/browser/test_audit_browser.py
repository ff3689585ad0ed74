"""The audit trail in a real headless Chromium: a person pauses a job with a note,
reads it on the job's page, and finds it again in the searchable list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store import Store
from tests.browser.conftest import CHROMIUM, log_in

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium "
                              "(apt-get install chromium)"),
]


def test_a_person_pauses_with_a_note_and_finds_it_in_the_trail(
        page: Any, live_server: Any, admin_user: Any, zstore: Store, artifacts: Path) -> None:
    job = ZSchedJob.objects.create(name="Heise news", interval_s=300,
                                   url="http://127.0.0.1:8000/targets/feed/2.xml")
    admin = f"{live_server.url}/admin/"
    log_in(page, admin)

    page.goto(f"{admin}zsched/zschedjob/{job.pk}/change/")
    page.fill("input.zsched-note", "site asked us to slow down")
    page.click("button:text('Pause')")
    page.wait_for_selector(".messagelist .success:has-text('Paused 1 job')")
    assert zstore.get(job.job_id).paused
    # Back on the job's page: its trail shows the pause, newest first, with the note.
    rows = page.locator("#changes-group tbody tr.has_original")
    assert rows.count() == 2
    assert "site asked us to slow down" in rows.nth(0).inner_text()
    assert "Paused" in rows.nth(0).inner_text() and "Created" in rows.nth(1).inner_text()
    page.screenshot(path=str(artifacts / "admin-audit-inline.png"), full_page=True)

    page.goto(f"{admin}zsched/zschedjobchange/?q=slow+down")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "admin" in page.locator("#result_list tbody tr").inner_text()
    page.screenshot(path=str(artifacts / "admin-audit-list.png"), full_page=True)
