"""Fixtures of the browser and example-project tests.

Django is pointed at the session's throwaway redis-server by the
``zsched_redis`` and ``zstore`` fixtures of tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Screenshots and logs a person can look at after the run (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture
def artifacts() -> Path:
    """``artifacts/`` at the repository root, created on demand."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


CHROMIUM = Path("/usr/bin/chromium")
# Everything that would reach out of the machine is off: no network but loopback here.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture
def page(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Chromium page, 1400 px wide, with short timeouts (everything here is local)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop on this thread, which Django
    # takes for async code and so refuses the test's own ORM calls. They are
    # plain blocking calls between page steps, which is safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def log_in(page: Any, admin: str) -> None:
    """Log in to the admin at ``admin`` as the ``admin_user`` fixture's admin/password."""
    page.goto(admin)
    page.fill("#id_username", "admin")
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
