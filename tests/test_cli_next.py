"""``celery -A tests.cli_app zsched next ID`` against real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta

import pytest
from click.testing import Result

from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke

Run = Callable[..., Result]


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "next", max_jitter_s=0)


@pytest.fixture
def run(prefix: str) -> Run:
    return invoke


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str) -> Store:
    return make_store(key_prefix=prefix, max_jitter_s=0)


def add_cron(store: Store, job_id: str, expr: str, **fields: object) -> None:
    store.upsert(Job.from_dict({"id": job_id, "task": "t", "cron": expr,
                                "timezone": "Europe/Berlin", **fields}))


def test_lists_fires_in_the_zone_and_in_utc(run: Run, zstore: Store) -> None:
    add_cron(zstore, "daily", "0 12 * * *", jitter_s=30)
    result = run("next", "daily", "-n", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "daily: 0 12 * * *, zone Europe/Berlin, scheduled"
    assert lines[1].split() == ["#", "LOCAL", "UTC", "JITTER"]
    rows = lines[2:]
    assert len(rows) == 3
    # Local noon is 10:00 or 11:00 UTC (summer or winter time), plus the drawn jitter.
    assert all(" 12:00:" in row and (" 10:00:" in row or " 11:00:" in row) for row in rows)
    # The first is the stored due time (jitter drawn), the others carry the bound.
    assert "+0..30s" in rows[1] and "+0..30s" in rows[2]


def last_sunday(year: int, month: int) -> date:
    day = date(year, month, 31)
    return day - timedelta(days=(day.weekday() + 1) % 7)


def test_json_marks_dst_shifted_and_repeated_fires(run: Run, zstore: Store) -> None:
    # Next year's DST changes in Berlin (last Sundays of March and October),
    # so they are in the future whenever the test runs; start_at picks the day.
    year = datetime.now(UTC).year + 1
    spring, autumn = last_sunday(year, 3), last_sunday(year, 10)
    add_cron(zstore, "gap", "30 2 * * *", start_at=f"{spring}T00:00:00Z")
    add_cron(zstore, "fold", "0 * * * *", start_at=f"{autumn}T01:30:00+02:00")
    gap = json.loads(run("next", "gap", "-n", "2", "--json").output)["fires"]
    assert gap[0]["utc"] == f"{spring}T01:30:00Z" and gap[0]["shifted"]
    assert gap[0]["local"] == f"{spring}T03:30:00+02:00" and not gap[1]["shifted"]
    assert "shifted: a DST gap" in run("next", "gap", "-n", "1").output
    fold = json.loads(run("next", "fold", "-n", "3", "--json").output)["fires"]
    assert [f["utc"] for f in fold] == [f"{autumn}T00:00:00Z", f"{autumn}T01:00:00Z",
                                        f"{autumn}T02:00:00Z"]
    assert [f["repeated"] for f in fold] == [True, True, False]
    # The words the admin's live preview shows come with the JSON, from one place.
    assert [f["dst_note"] for f in fold] == ["repeated: DST fold, pass 1 of 2",
                                             "repeated: DST fold, pass 2 of 2", ""]
    assert gap[0]["dst_note"] == "shifted: a DST gap skipped its wall time"
    text = run("next", "fold", "-n", "3").output
    assert "pass 1 of 2" in text and "pass 2 of 2" in text


def test_paused_and_finished_jobs_say_so(run: Run, zstore: Store) -> None:
    add_cron(zstore, "p", "0 12 * * *")
    zstore.pause("p")
    result = run("next", "p")
    assert result.exit_code == 0
    assert result.output.splitlines() == ["p: 0 12 * * *, zone Europe/Berlin, paused",
                                          "paused: resume it to schedule it again"]
    assert json.loads(run("next", "p", "--json").output)["fires"] == []


def test_max_runs_cuts_the_list(run: Run, zstore: Store) -> None:
    add_cron(zstore, "m", "0 12 * * *", max_runs=2)
    lines = run("next", "m", "-n", "5").output.splitlines()
    assert len(lines) == 2 + 2 + 1 and lines[-1] == "then finished: max_runs (2) reached"


def test_unknown_id_is_one_line_and_exit_1(run: Run, zstore: Store) -> None:
    result = run("next", "nope")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: no such job: 'nope'"]


@pytest.mark.parametrize("bad", ["0", "-3", "ten", "100000"])
def test_bad_count_names_the_option(run: Run, zstore: Store, bad: str) -> None:
    add_cron(zstore, "daily", "0 12 * * *")
    result = run("next", "daily", "-n", bad)
    assert result.exit_code == 2
    assert "'-n' / '--count'" in result.output
