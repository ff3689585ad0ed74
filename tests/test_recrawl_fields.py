"""The recrawl fields (issue 22): validated in the core with named errors, settable in
every place a job is defined, and carried through export and import unchanged."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_zsched.core.errors import ConfigurationError, ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.recrawl import bounds_s, current_interval_s
from celery_zsched.core.rows import write_rows
from celery_zsched.core.state import RuntimeState
from celery_zsched.services.beat_entries import job_from_entry
from celery_zsched.services.importer import import_file
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke

ADAPTIVE = {"url": "https://a.example/page", "interval_s": 600, "recrawl": "adaptive",
            "min_interval_s": 60, "max_interval_s": 86_400, "freshness_target": 0.9}


def test_an_adaptive_job_keeps_its_fields_and_a_fixed_one_leaves_them_out() -> None:
    job = Job.from_dict(ADAPTIVE)
    assert (job.recrawl, job.min_interval_s, job.max_interval_s, job.freshness_target) == (
        "adaptive", 60, 86_400, 0.9)
    plain = Job.from_dict({"url": "https://a.example/page", "interval_s": 600})
    assert plain.recrawl == "fixed" and "recrawl" not in plain.to_json()


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"cron": "*/5 * * * *", "interval_s": None}, "recrawl", "a cron job keeps its slots"),
    ({"run_at": 1_900_000_000, "interval_s": None}, "recrawl", "a one-off job runs once"),
    ({"recrawl": "sometimes"}, "recrawl", 'must be "fixed"'),
    ({"min_interval_s": 600, "max_interval_s": 60}, "max_interval_s", "at least min_interval_s"),
    ({"min_interval_s": 0}, "min_interval_s", ">= 0.001"),
    ({"max_interval_s": "soon"}, "max_interval_s", "must be a number"),
    ({"freshness_target": 1}, "freshness_target", "between 0 and 1"),
    ({"freshness_target": 0}, "freshness_target", "between 0 and 1"),
    ({"freshness_target": -0.5}, "freshness_target", ""),
])
def test_bad_recrawl_fields_are_refused_naming_the_field_and_row(
        extra: dict[str, Any], field: str, words: str) -> None:
    data = {k: v for k, v in {**ADAPTIVE, **extra}.items() if v is not None}
    with pytest.raises(ValidationError) as err:
        Job.from_dict(data, row=7)
    assert err.value.field == field and words in str(err.value)
    assert str(err.value).startswith("line 7: ")


def test_the_bounds_default_to_a_tenth_and_ten_times_the_interval() -> None:
    job = Job.from_dict({"url": "https://a.example/p", "interval_s": 300, "recrawl": "adaptive"})
    assert bounds_s(job) == (30.0, 3000.0)


def test_current_interval_is_the_fixed_one_until_an_adaptive_settle_chose_one() -> None:
    adaptive, fixed = Job.from_dict(ADAPTIVE), Job.from_dict({**ADAPTIVE, "recrawl": "fixed"})
    chosen = RuntimeState(recrawl_interval_ms=1_234_000)
    assert current_interval_s(adaptive) == 600
    assert current_interval_s(adaptive, chosen) == 1234
    assert current_interval_s(fixed, chosen) == 600
    cron = Job.from_dict({"id": "c", "task": "t", "cron": "* * * * *"})
    assert current_interval_s(cron, chosen) is None


def test_the_setting_refuses_a_target_outside_zero_to_one(
        make_settings: Callable[..., Any]) -> None:
    with pytest.raises(ConfigurationError, match="freshness_target"):
        make_settings(freshness_target=1.0).validate()


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_adaptive_jobs_export_and_import_unchanged(fmt: str, tmp_path: Path,
                                                   store: Store) -> None:
    jobs = [Job.from_dict({**ADAPTIVE, "url": f"https://a.example/{i}"}) for i in range(3)]
    jobs.append(Job.from_dict({"url": "https://a.example/fixed", "interval_s": 60}))
    buf = io.StringIO()
    write_rows(jobs, buf, fmt)
    path = tmp_path / f"jobs.{fmt}"
    path.write_text(buf.getvalue(), "utf-8")
    report, errors = import_file(store, path)
    assert errors == [] and report.created == 4
    assert [store.get(job.id).job for job in jobs] == jobs


def test_beat_schedule_options_set_the_recrawl_fields() -> None:
    job = job_from_entry("feed", {"task": "t", "schedule": 600.0, "options": {
        "recrawl": "adaptive", "min_interval_s": 60, "max_interval_s": 6000,
        "freshness_target": 0.95}}, Defaults())
    assert (job.recrawl, job.min_interval_s, job.max_interval_s, job.freshness_target) == (
        "adaptive", 60, 6000, 0.95)
    with pytest.raises(ConfigurationError, match=r"beat_schedule\['c'\]\.recrawl"):
        job_from_entry("c", {"task": "t", "schedule": __import__("celery").schedules.crontab(),
                             "options": {"recrawl": "adaptive"}}, Defaults())


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "clirecrawl")


def test_cli_add_stores_an_adaptive_job_and_names_a_bad_option(
        make_store: Callable[..., Store], prefix: str) -> None:
    zstore = make_store(key_prefix=prefix)
    result = invoke("add", "--url", "https://a.example/x", "--interval", "600",
                    "--recrawl", "adaptive", "--min-interval", "60", "--max-interval", "6000",
                    "--freshness-target", "0.9")
    assert result.exit_code == 0, result.output
    job = zstore.get(result.stdout.split()[0]).job
    assert (job.recrawl, job.min_interval_s, job.max_interval_s, job.freshness_target) == (
        "adaptive", 60, 6000, 0.9)
    bad = invoke("add", "--url", "https://a.example/y", "--cron", "* * * * *",
                 "--recrawl", "adaptive")
    assert bad.exit_code == 65 and "invalid --recrawl: adaptive needs an interval job" in bad.stderr
    bad = invoke("add", "--url", "https://a.example/y", "--min-interval", "60",
                 "--max-interval", "6")
    assert bad.exit_code == 65 and "invalid --max-interval" in bad.stderr
