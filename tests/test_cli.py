"""``celery -A tests.cli_app zsched ...`` run in-process through Celery's own CLI, and once
as a real subprocess, against the throwaway Redis of conftest.py.

Every rejected command is checked to have written nothing to Redis.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

import pytest
import redis
from celery.bin.celery import celery
from click.testing import CliRunner, Result

from celery_zsched.core.job import job_id_for_url
from celery_zsched.services.appstore import forget_app
from celery_zsched.store import Store
from tests.cli_env import APP, ROOT, cli_prefix, invoke
from tests.helpers import store_snapshot

CELERY = Path(sys.executable).with_name("celery")
UNREACHABLE = "redis://127.0.0.1:1/0"

Run = Callable[..., Result]


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh key prefix, passed to the app through the ``ZSCHED_*`` environment."""
    yield from cli_prefix(redis_url, monkeypatch, "cli")


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str) -> Store:
    """The store the CLI writes to, for checking what it did."""
    return make_store(timezone="Europe/Berlin", key_prefix=prefix)


@pytest.fixture
def run(prefix: str) -> Run:
    """Invoke ``celery -A tests.cli_app zsched ARGS``; exceptions are not swallowed."""
    return invoke


def due_times(store: Store) -> dict[str, float]:
    """Job id -> due time (ms) of every scheduled job."""
    pairs = cast("list[tuple[str, float]]",
                 store.client.zrange(store.keys.schedule, 0, -1, withscores=True))
    return dict(pairs)


def _write(tmp_path: Path, name: str, rows: list[dict[str, Any]] | str) -> Path:
    path = tmp_path / name
    text = rows if isinstance(rows, str) else json.dumps(rows, indent=1)
    path.write_text(text, encoding="utf-8")
    return path


def _urls(count: int, interval_s: int = 300) -> list[dict[str, Any]]:
    return [{"url": f"https://a.example/{i}", "interval_s": interval_s, "jitter_s": 0}
            for i in range(count)]


def _iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


# -------------------------------------------------------------------- add
def test_add_a_url_job_prints_its_id_and_next_run(run: Run, zstore: Store) -> None:
    before = zstore.now_ms()
    result = run("add", "--url", "https://a.example/x", "--interval", "60", "--meta", "site=a",
                 "--meta", "n=5", "--kwarg", "depth=2", "--kwarg", "tag=x", "--arg", "[1]")
    assert result.exit_code == 0, result.output
    job_id, summary = result.stdout.splitlines()
    assert job_id == job_id_for_url("https://a.example/x")
    assert summary.startswith("created interval job; next run: ")
    assert abs(_iso_ms(summary.rsplit(" ", 1)[1]) - before) < 5_000
    job = zstore.get(job_id).job
    assert (job.task, job.interval_s, job.url) == ("scrape", 60.0, "https://a.example/x")
    assert job.meta == {"site": "a", "n": "5"}
    assert job.kwargs == {"depth": 2, "tag": "x"}
    assert job.args == [[1]]


def test_add_again_updates_the_job_in_place(run: Run, zstore: Store) -> None:
    run("add", "--id", "j", "--task", "t", "--interval", "60")
    due = zstore.get("j").due_ms
    result = run("add", "--id", "j", "--task", "t", "--interval", "60", "--queue", "slow")
    assert result.exit_code == 0
    assert "updated interval job" in result.stdout
    info = zstore.get("j")
    assert (info.job.queue, info.due_ms) == ("slow", due)


def test_add_a_cron_job_uses_the_app_time_zone_by_default(run: Run, zstore: Store) -> None:
    result = run("add", "--id", "feed", "--task", "feeds.fetch", "--cron", "0 9 * * *")
    assert result.exit_code == 0, result.output
    info = zstore.get("feed")
    assert (info.job.kind, info.job.timezone) == ("cron", "Europe/Berlin")
    assert info.due_ms is not None
    local = datetime.fromtimestamp(info.due_ms / 1000, ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (9, 0)


def test_add_takes_every_option(run: Run, zstore: Store) -> None:
    result = run(
        "add", "--id", "all", "--task", "t", "--name", "every option", "--run-at", "2100000000",
        "--tz", "UTC", "--jitter", "2.5", "--queue", "q", "--routing-key", "rk",
        "--priority", "7", "--expires", "30", "--start-at", "2030-01-01T00:00:00Z",
        "--end-at", "2040-01-01T00:00:00", "--max-runs", "4", "--misfire-grace", "60",
        "--paused")
    assert result.exit_code == 0, result.output
    assert "next run: paused" in result.stdout
    info = zstore.get("all")
    job = info.job
    assert (job.kind, job.run_at, job.name) == ("once", 2_100_000_000_000, "every option")
    assert (job.jitter_s, job.queue, job.routing_key, job.priority) == (2.5, "q", "rk", 7)
    assert (job.expires_s, job.max_runs, job.misfire_grace_s) == (30.0, 4, 60.0)
    assert (job.start_at, job.end_at) == (1_893_456_000_000, 2_208_988_800_000)
    assert job.enabled is False and info.paused is True


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "https://a.example/x", "--interval", "-5"], "invalid --interval: must be a "),
    (["--id", "x", "--task", "t", "--cron", "61 * * * *"],
     "invalid --cron: '61' is not in 0-59 for minutes (got '61 * * * *')"),
    (["--id", "x", "--task", "t", "--cron", "0 0 * * * *"],
     "invalid --cron: expected 5 fields (minute hour day-of-month month day-of-week), got 6"),
    (["--id", "x", "--task", "t", "--cron", "0 0 31 2 *"], "invalid --cron: never fires"),
    (["--id", "x", "--task", "t", "--cron", "* * * * *", "--tz", "Mars/Base"],
     "invalid --tz: unknown IANA time zone (got 'Mars/Base')"),
    (["--url", "ftp://a.example/x"], "invalid --url: must be an absolute http(s) URL"),
    (["--id", "x"], "invalid --task: a job without a url needs a task name"),
    (["--url", "https://a.example/x", "--interval", "5", "--cron", "* * * * *"],
     "invalid --cron: give only one of --interval, --cron, --run-at (also got --interval)"),
    (["--id", "x", "--task", "t", "--interval", "5", "--start-at", "2040-01-02T00:00:00",
      "--end-at", "2040-01-01T00:00:00"], "invalid --end-at: must be after --start-at"),
    (["--id", "x", "--task", "t", "--run-at", "tomorrow"], "invalid --run-at: must be an ISO"),
])
def test_add_rejects_bad_input_and_writes_nothing(run: Run, zstore: Store, args: list[str],
                                                  message: str) -> None:
    run("add", "--id", "existing", "--task", "t", "--interval", "60")
    before = store_snapshot(zstore)
    result = run("add", *args)
    assert result.exit_code == 65
    assert message in result.stderr
    assert result.stdout == ""
    assert store_snapshot(zstore) == before


def test_add_rejects_a_malformed_pair_as_a_usage_error(run: Run, zstore: Store) -> None:
    result = run("add", "--url", "https://a.example/x", "--meta", "novalue")
    assert result.exit_code == 2
    assert "expected KEY=VALUE" in result.stderr
    assert store_snapshot(zstore)["keys"] == 0


# ----------------------------------------------------------------- import
def test_import_stores_staggered_jobs_and_reports_progress(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "jobs.json", _urls(40, interval_s=400))
    result = run("import", "--file", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("imported 40 job(s): created 40, updated 0, rescheduled 0 in ")
    assert "storing " in result.stderr and "40/40 (100%)" in result.stderr
    scores = sorted(due_times(zstore).values())
    assert len(scores) == 40
    # 40 jobs over 400 s: one every 10 s.
    assert all(9_000 <= b - a <= 11_000 for a, b in itertools.pairwise(scores))


def test_import_twice_updates_without_moving_schedules(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "jobs.jsonl", "\n".join(json.dumps(r) for r in _urls(10)))
    assert run("import", "-f", str(path)).exit_code == 0
    before = zstore.client.zrange(zstore.keys.schedule, 0, -1, withscores=True)
    result = run("import", "-f", str(path))
    assert "created 0, updated 10, rescheduled 0" in result.stdout
    assert zstore.client.zrange(zstore.keys.schedule, 0, -1, withscores=True) == before


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("jobs.json", json.dumps([*_urls(3)[:2], {"url": "https://a.example/9", "interval_s": -1}],
                             indent=1),
     "job 3 (url 'https://a.example/9'): interval_s: must be a finite number"),
    ("jobs.csv", "id,task,cron\na,t,0 9 * * *\nb,t,0 9 * *\n",
     "job 2 (line 3, id 'b'): cron: "),
    ("jobs.jsonl", '{"id": "a", "task": "t"}\n{"id": "b", "task": "t", "timezone": "Nowhere"}',
     "job 2 (line 2, id 'b'): timezone: unknown IANA time zone"),
    ("jobs.json", '[\n {"url": "https://a.example/1"}\n {"url": "https://a.example/2"}\n]',
     "file: malformed JSON at line 3, column 2: Expecting ',' delimiter"),
    ("jobs.csv", "url,colour\nhttps://a.example/1,red\n",
     "colour: unknown column in the header (line 1)"),
    ("jobs.jsonl", '{"url": "https://a.example/1"}\n{"url": "https://a.example/1"}\n',
     "job 2 (line 2, url 'https://a.example/1'): id: duplicate id, first as job 1 (line 1)"),
])
def test_a_bad_import_exits_non_zero_names_row_and_field_and_writes_nothing(
        run: Run, zstore: Store, tmp_path: Path, name: str, text: str, expected: str) -> None:
    assert run("import", "-f", str(_write(tmp_path, "old.json", _urls(5)))).exit_code == 0
    before = store_snapshot(zstore)
    result = run("import", "-f", str(_write(tmp_path, name, text)))
    assert result.exit_code == 65
    assert expected in result.stderr
    assert "Traceback" not in result.output
    assert store_snapshot(zstore) == before


def test_a_missing_import_file_is_a_clear_error(run: Run, zstore: Store,
                                                tmp_path: Path) -> None:
    result = run("import", "-f", str(tmp_path / "nope.json"))
    assert result.exit_code == 65
    assert "file: cannot be read: No such file or directory" in result.stderr
    assert store_snapshot(zstore)["keys"] == 0


def test_import_skip_invalid_stores_the_rest_and_lists_the_skipped_rows(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    text = "url,interval_s\nhttps://a.example/1,60\nhttps://a.example/2,-1\nftp://x,\n"
    result = run("import", "-f", str(_write(tmp_path, "jobs.csv", text)), "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert "skipped job 2 (line 3, url 'https://a.example/2'): interval_s:" in result.stderr
    assert "skipped job 3 (line 4, url 'ftp://x'): url:" in result.stderr
    assert "created 1, updated 0, rescheduled 0, skipped 2 invalid job(s)" in result.stdout
    assert zstore.client.hkeys(zstore.keys.defs) == [job_id_for_url("https://a.example/1")]


def test_import_dry_run_validates_and_writes_nothing(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    good = _write(tmp_path, "good.json", _urls(7))
    result = run("import", "-f", str(good), "--dry-run")
    assert result.exit_code == 0
    assert result.stdout.startswith("dry run: 7 valid job(s), 0 invalid job(s)")
    bad = _write(tmp_path, "bad.json", [*_urls(2), {"url": "nope"}])
    result = run("import", "-f", str(bad), "--dry-run")
    assert result.exit_code == 65
    assert ("Error: 1 invalid job(s), nothing was written:\n  job 3 (url 'nope'): url:"
            in result.stderr)
    assert "skipped" not in result.stderr
    result = run("import", "-f", str(bad), "--dry-run", "--skip-invalid")
    assert result.exit_code == 0
    assert "skipped job 3 (url 'nope'): url:" in result.stderr
    assert result.stdout.startswith("dry run: 2 valid job(s), 1 invalid job(s)")
    assert store_snapshot(zstore)["keys"] == 0


def test_a_dry_run_does_not_need_redis(run: Run, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    monkeypatch.setenv("ZSCHED_REDIS_URL", UNREACHABLE)
    result = run("import", "-f", str(_write(tmp_path, "jobs.json", _urls(3))), "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dry run: 3 valid job(s)")


def test_import_format_option_overrides_the_suffix(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    path = _write(tmp_path, "jobs.txt", "id,task,interval_s\na,t,60\n")
    assert run("import", "-f", str(path)).exit_code == 65
    result = run("import", "-f", str(path), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert zstore.get("a").job.interval_s == 60.0


# ----------------------------------------------------------------- export
@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_export_then_import_elsewhere_gives_identical_definitions(
        run: Run, zstore: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        make_store: Callable[..., Store], fmt: str) -> None:
    rows = [*_urls(5), {"id": "c", "task": "t", "cron": "*/5 * * * *", "kwargs": {"a": [1]}},
            {"id": "o", "task": "t", "run_at": "2035-01-01T10:00:00", "name": "x,\"y\"\nz"},
            {"url": "https://a.example/utc", "timezone": "UTC", "enabled": False}]
    assert run("import", "-f", str(_write(tmp_path, "in.json", rows))).exit_code == 0
    out = tmp_path / f"out.{fmt}"
    result = run("export", "--file", str(out))
    assert result.exit_code == 0, result.output
    assert "exported 8 job(s)" in result.stderr
    other = "{cli" + uuid.uuid4().hex[:8] + "}:"
    monkeypatch.setenv("ZSCHED_KEY_PREFIX", other)
    forget_app(importlib.import_module(APP).app)
    result = run("import", "-f", str(out))
    assert result.exit_code == 0, result.output
    again = make_store(key_prefix=other)
    assert again.client.hgetall(again.keys.defs) == zstore.client.hgetall(zstore.keys.defs)
    assert again.client.scard(again.keys.paused) == 1


def test_export_to_stdout_is_json_and_nothing_else(run: Run, zstore: Store,
                                                   tmp_path: Path) -> None:
    run("import", "-f", str(_write(tmp_path, "in.json", _urls(3))))
    result = run("export")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert sorted(r["url"] for r in rows) == [f"https://a.example/{i}" for i in range(3)]
    result = run("export", "--format", "jsonl")
    assert len([json.loads(line) for line in result.stdout.splitlines()]) == 3


def test_a_failed_export_leaves_the_previous_file_alone(
        run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = _write(tmp_path, "out.json", "previous export\n")
    monkeypatch.setenv("ZSCHED_REDIS_URL", UNREACHABLE)
    result = run("export", "-f", str(out))
    assert result.exit_code == 69
    assert out.read_text(encoding="utf-8") == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# ------------------------------------------------------------------ reads
def test_list_orders_jobs_by_due_time_and_pages(run: Run, zstore: Store,
                                                tmp_path: Path) -> None:
    rows = [{"id": f"j{i}", "task": "t", "run_at": f"2040-01-0{9 - i}T00:00:00Z"}
            for i in range(5)]
    run("import", "-f", str(_write(tmp_path, "in.json", rows)))
    result = run("list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "KIND", "NEXT", "RUN", "STATUS", "TARGET"]
    assert [line.split()[0] for line in lines[1:]] == ["j4", "j3", "j2", "j1", "j0"]
    assert lines[1].split()[1:] == ["once", "2040-01-05T00:00:00.000Z", "scheduled", "t"]
    page = run("list", "--limit", "2", "--offset", "1").stdout.splitlines()[1:]
    assert [line.split()[0] for line in page] == ["j3", "j2"]


def test_show_prints_definition_and_state_as_json(run: Run, zstore: Store) -> None:
    run("add", "--id", "s", "--task", "t", "--cron", "0 9 * * *", "--tz", "Asia/Tokyo")
    result = run("show", "s")
    assert result.exit_code == 0
    shown = json.loads(result.stdout)
    assert shown["definition"] == {"id": "s", "task": "t", "cron": "0 9 * * *",
                                   "timezone": "Asia/Tokyo"}
    assert (shown["kind"], shown["status"], shown["paused"]) == ("cron", "scheduled", False)
    assert _iso_ms(shown["next_run"]) == zstore.get("s").due_ms
    assert shown["state"]["attempt"] == 1 and shown["state"]["runs"] == 0


def test_stats_reports_the_store_counts(run: Run, zstore: Store, tmp_path: Path) -> None:
    run("import", "-f", str(_write(tmp_path, "in.json", _urls(4))))
    run("pause", job_id_for_url("https://a.example/0"))
    result = run("stats", "--json")
    assert result.exit_code == 0
    counts = json.loads(result.stdout)
    assert (counts["jobs"], counts["scheduled"], counts["paused"]) == (4, 3, 1)
    stable = ("jobs", "scheduled", "in_flight", "paused", "dead")
    assert [counts[k] for k in stable] == [zstore.stats()[k] for k in stable]
    text = run("stats").stdout.splitlines()
    assert text[0].split() == ["jobs", "4"]


# ---------------------------------------------------------------- control
def test_pause_resume_run_now_and_delete(run: Run, zstore: Store) -> None:
    run("add", "--id", "p", "--task", "t", "--interval", "3600")
    result = run("pause", "p")
    assert (result.exit_code, result.stdout) == (0, "paused p\n")
    assert zstore.get("p").paused and zstore.get("p").due_ms is None
    assert run("pause", "p").stdout == "p: already paused\n"
    result = run("resume", "p")
    assert result.stdout.startswith("resumed p\nnext run: ")
    assert zstore.get("p").due_ms is not None
    now = zstore.now_ms()
    assert run("run-now", "p").stdout == "p is due now\n"
    due = zstore.get("p").due_ms
    assert due is not None and abs(due - now) < 5_000
    assert [c.job.id for c in zstore.claim().jobs] == ["p"]
    result = run("run-now", "p")
    assert (result.exit_code, result.stdout) == (0, "p: in flight, left alone\n")
    assert zstore.get("p").due_ms is None
    assert run("delete", "p").stdout == "deleted p\n"
    assert store_snapshot(zstore)["defs"] == {}


def test_control_commands_take_many_ids(run: Run, zstore: Store) -> None:
    for job_id in ("a", "b", "c"):
        run("add", "--id", job_id, "--task", "t", "--interval", "60")
    assert run("pause", "a", "b").stdout == "paused 2 of 2 job(s)\n"
    assert zstore.client.smembers(zstore.keys.paused) == {"a", "b"}
    assert run("delete", "a", "b", "c").stdout == "deleted 3 of 3 job(s)\n"


@pytest.mark.parametrize("command", ["show", "pause", "resume", "run-now", "delete"])
def test_an_unknown_id_exits_1_and_changes_nothing(run: Run, zstore: Store,
                                                   command: str) -> None:
    run("add", "--id", "known", "--task", "t", "--interval", "60")
    before = store_snapshot(zstore)
    result = run(command, "nope")
    assert result.exit_code == 1
    assert "no such job: 'nope'" in result.stderr
    if command != "show":
        result = run(command, "known", "nope")
        assert result.exit_code == 1
        assert "no such job(s): nope; nothing changed" in result.stderr
    assert store_snapshot(zstore) == before


# ------------------------------------------------------------ Redis down
@pytest.mark.parametrize("args", [
    ["list"], ["stats"], ["show", "x"], ["pause", "x"], ["export"],
    ["add", "--url", "https://a.example/x"],
])
def test_unreachable_redis_is_a_clear_error_without_traceback(
        run: Run, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setenv("ZSCHED_REDIS_URL", UNREACHABLE)
    result = run(*args)
    assert result.exit_code == 69
    assert result.stderr.startswith("Error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert "Connection refused" in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_setting_is_a_configuration_error(run: Run,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSCHED_BATCH_SIZE", "lots")
    result = run("stats")
    assert result.exit_code == 78
    assert result.stderr.startswith("Error: configuration: ZSCHED_BATCH_SIZE")
    assert "'lots'" in result.stderr


# ------------------------------------------------------------- subprocess
@pytest.mark.slow
def test_the_installed_celery_command_imports_and_exits_with_status(
        redis_url: str, rclient: redis.Redis, prefix: str, zstore: Store,
        tmp_path: Path) -> None:
    """``celery -A tests.cli_app zsched import`` as a real process, through its entry point."""
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_KEY_PREFIX": prefix,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}

    def celery_zsched(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CELERY), "-A", APP, "zsched", *args], cwd=tmp_path,
                              env={**env, **overrides}, capture_output=True, text=True,
                              timeout=120, check=False)

    good = _write(tmp_path, "jobs.json", _urls(25))
    done = celery_zsched("import", "--file", str(good))
    assert done.returncode == 0, done.stderr
    assert "created 25" in done.stdout
    assert zstore.client.hlen(zstore.keys.defs) == 25

    before = store_snapshot(zstore)
    bad = _write(tmp_path, "bad.csv", "url,interval_s\nhttps://a.example/1,60\nhttps://x,0\n")
    done = celery_zsched("import", "--file", str(bad))
    assert done.returncode == 65
    assert "job 2 (line 3, url 'https://x'): interval_s: must be a finite number >= 0.001" in (
        done.stderr)
    assert "Traceback" not in done.stderr
    assert store_snapshot(zstore) == before

    done = celery_zsched("import", "--file", str(good), ZSCHED_REDIS_URL=UNREACHABLE)
    assert done.returncode == 69
    assert "cannot reach Redis" in done.stderr and "Traceback" not in done.stderr


def test_without_an_app_the_cli_says_it_uses_celerys_default_app(tmp_path: Path) -> None:
    """``celery zsched stats`` with no ``-A``: a note on stderr before any Redis is touched."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELERY_", "ZSCHED_", "DJANGO_"))}
    done = subprocess.run([str(CELERY), "zsched", "stats"], cwd=tmp_path,
                          env={**env, "ZSCHED_REDIS_URL": UNREACHABLE}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 69, done.stderr
    note = ("zsched: no -A/--app given: using Celery's default app and its settings "
            f"({UNREACHABLE})\n")
    assert done.stderr.startswith(note), done.stderr
    assert done.stderr.count("no -A/--app given") == 1
    assert "cannot reach Redis" in done.stderr[len(note):]


def test_with_an_app_the_cli_says_nothing_about_the_default_app(
        run: Run, prefix: str) -> None:
    """``-A`` given: no note."""
    result = run("stats")
    assert result.exit_code == 0, result.output
    assert "default app" not in result.stderr


# ------------------------------------------------------ bad input never crashes
_DEEP = "[" * 100_000 + "]" * 100_000


def _short_id(value: Any) -> str:
    # Test ids land in PYTEST_CURRENT_TEST: a megabyte id breaks every exec().
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 24 else f"{text[:16]}...({len(text)})"


@pytest.mark.parametrize(("name", "text", "expected"), ids=_short_id, argvalues=[
    ("deep.json", '[\n{"url": "https://a.example/1"},\n' + _DEEP + "\n]",
     "file: malformed JSON at line 3: nested too deeply"),
    ("deep.jsonl", '{"url": "https://a.example/1"}\n{"meta": ' + _DEEP + "}\n",
     "file: malformed JSON at line 2: nested too deeply"),
    ("ipv6.jsonl", '{"url": "https://a.example/1"}\n{"url": "http://[::1"}\n',
     "job 2 (line 2, url 'http://[::1'): url: must be an absolute http(s) URL: Invalid IPv6 URL"),
    ("huge.json", '[\n{"url": "https://a.example/1", "interval_s": 1' + "0" * 400 + "}\n]",
     "job 1 (url 'https://a.example/1'): interval_s: must be a number"),
    ("digits.jsonl", '{"url": "https://a.example/1", "jitter_s": ' + "9" * 5000 + "}\n",
     "file: malformed JSON at line 1: Exceeds the limit (4300 digits)"),
    ("folder.csv", "id,task,cron,timezone\na,t,0 9 * * *,Europe\n",
     "job 1 (line 2, id 'a'): timezone: unknown IANA time zone (got 'Europe')"),
    ("surrogate.jsonl", '{"id": "a", "task": "t", "name": "\\udc80"}\n',
     "job 1 (line 1, id 'a'): name: must be valid Unicode (it holds a lone surrogate)"),
    ("nan.json", '[{"id": "a", "task": "t", "interval_s": NaN}]',
     "job 1 (id 'a'): interval_s: must be a finite number"),
    ("inf-meta.json", '[{"id": "a", "task": "t", "meta": {"x": -Infinity}}]',
     "job 1 (id 'a'): meta: must not contain NaN or Infinity"),
    ("range.csv", "id,task,run_at\na,t,-1e20\n",
     "job 1 (line 2, id 'a'): run_at: must be an ISO 8601 date-time"),
    ("year1.csv", "id,task,run_at\na,t,0001-01-01T00:00:00\n",
     "job 1 (line 2, id 'a'): run_at: must be from 1970-01-01 to 9999-12-31 (UTC)"),
    ("long.jsonl", '{"id": "a", "task": "t", "name": "' + "n" * 1_000_000 + '"}\n',
     "job 1 (line 1, id 'a'): name: must be at most 200 characters, not 1,000,000"),
    ("deep-cell.csv", 'id,task,meta\na,t,"' + "[" * 50_000 + '"\n',
     "job 1 (line 2, id 'a'): meta: must be nested at most 32 levels deep"),
    ("shape.jsonl", '"row"\n', "file: line 1 is a JSON string, not an object"),
    ("shape.json", '{"url": "https://a.example/1"}',
     "file: must be a JSON array of objects, not an object (line 1)"),
])
def test_a_file_of_each_crash_found_by_fuzzing_exits_65_naming_row_and_field(
        run: Run, zstore: Store, tmp_path: Path, name: str, text: str, expected: str) -> None:
    """Each of these ended in a traceback and exit 1; nothing may be written."""
    assert run("import", "-f", str(_write(tmp_path, "old.json", _urls(3)))).exit_code == 0
    before = store_snapshot(zstore)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = CliRunner().invoke(celery, ["-A", APP, "zsched", "import", "-f", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exc_info)
    assert result.exit_code == 65, result.output
    assert expected in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr) < 5000, "a huge value must be shortened"
    assert not result.stderr.startswith(("row 1: file:", "job 1"))
    assert store_snapshot(zstore) == before


def test_a_file_of_surrogates_is_not_utf8_and_names_its_line(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    """Raw surrogate bytes (CESU-8) in the file itself, not as a JSON escape."""
    path = tmp_path / "cesu.jsonl"
    path.write_bytes(b'{"url": "https://a.example/1"}\n{"name": "\xed\xb2\x80"}\n')
    result = run("import", "-f", str(path))
    assert result.exit_code == 65
    assert "file: is not UTF-8 at line 2" in result.stderr
    assert store_snapshot(zstore)["keys"] == 0


@pytest.mark.parametrize(("args", "message"), ids=_short_id, argvalues=[
    (["--id", "x", "--task", "t", "--arg", _DEEP], "invalid --arg: must be nested at most"),
    (["--id", "x", "--task", "t", "--kwarg", "k=" + "[" * 5000 + "]" * 5000],
     "invalid --kwarg: must be nested at most"),
    (["--url", "http://[::1"], "invalid --url: must be an absolute http(s) URL"),
    (["--id", "x", "--task", "t", "--cron", "0 9 * * *", "--tz", "Europe"],
     "invalid --tz: unknown IANA time zone"),
    (["--id", "x", "--task", "t", "--interval", "1" + "0" * 400], "invalid --interval:"),
    (["--id", "x", "--task", "t", "--name", "n" * 100_000], "invalid --name: must be at most"),
])
def test_add_rejects_each_crash_found_by_fuzzing(run: Run, zstore: Store, args: list[str],
                                                 message: str) -> None:
    result = CliRunner().invoke(celery, ["-A", APP, "zsched", "add", *args])
    assert result.exit_code == 65, result.output
    assert message in result.stderr
    assert len(result.stderr) < 1000
    assert store_snapshot(zstore)["keys"] == 0
