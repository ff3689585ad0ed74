"""The documentation site builds strictly, its generated references cover the code,
and the README stays a front door whose first screen holds the two commands."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.docs_pages import DOCS, README, REPO, generator, page, pages

#: How many lines of the README a newcomer sees first (a laptop's browser window).
FIRST_SCREEN = 40
DEMO = "python examples/quickstart/demo.py"
TESTS = 'pip install -e ".[dev]" && pytest'


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``, as CI runs it: a broken link or anchor, a page left out
    of the navigation, a stale note or a generator warning fails it (about 3 s)."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, run.stderr[-5000:]
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    for built in ("reference/configuration/index.html", "reference/cli/index.html",
                  "reference/python/index.html", "reference/rest-api/jobs/index.html"):
        assert (tmp_path / "site" / built).stat().st_size > 10_000, built


def test_the_readme_first_screen_has_the_demo_and_the_test_command() -> None:
    first_screen = "\n".join(README.read_text("utf-8").splitlines()[:FIRST_SCREEN])
    assert DEMO in first_screen
    assert TESTS in first_screen


def test_the_demo_the_readme_names_is_the_one_the_suite_runs() -> None:
    demos = (REPO / "tests" / "test_demos.py").read_text("utf-8")
    assert DEMO.split()[1] in demos


def test_the_readme_is_a_front_door_and_its_links_resolve() -> None:
    text = README.read_text("utf-8")
    assert len(text.encode()) < 16_000
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), target


def test_every_page_marker_names_a_generator() -> None:
    markers = [(path, m) for path, text in ((p, (DOCS / p).read_text("utf-8"))
                                            for p in pages())
               for m in re.findall(r"<!-- gen:([\w-]+)", text)]
    assert {name for _, name in markers} <= set(generator().GENERATORS), markers
    assert len(markers) >= 6


def test_the_configuration_reference_lists_every_setting_with_its_default() -> None:
    gen = generator()
    reference = page("reference/configuration.md")
    for module, name, _title in gen.SOURCES["settings"]:
        for field in dataclasses.fields(gen._load((module, name))):
            row = f"| `zsched_{field.name}` | `ZSCHED_{field.name.upper()}` | "
            assert row in reference, (name, field.name)
    assert "| `zsched_lease_s` | `ZSCHED_LEASE_S` | `30` |" in reference
    assert "| `zsched_pacing` | `ZSCHED_PACING` | `false` |" in reference


def test_the_redis_layout_lists_every_key() -> None:
    gen = generator()
    layout = page("reference/redis-layout.md")
    for key in gen._load(gen.SOURCES["keys"])().all():
        assert f"| `{key}` |" in layout, key


def test_the_rest_api_reference_covers_every_operation_of_the_openapi_document() -> None:
    document = generator().openapi()
    rendered = page("reference/rest-api/gateway.md") + page("reference/rest-api/jobs.md")
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"`{method.upper()} {path}`" in rendered, (method, path)
    schemas = page("reference/rest-api/schemas.md")
    for name in document["components"]["schemas"]:
        assert f"## {name}\n" in schemas, name
