"""Management commands: import/export round trips, bad rows, --skip-invalid, --update, etc."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedRun
from celery_zsched.core.job import Job
from celery_zsched.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(n: int, start: int = 0, **fields: Any) -> list[dict[str, Any]]:
    return [{"url": f"http://127.0.0.1:1/page/{i}", "interval_s": 60, **fields}
            for i in range(start, start + n)]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".csv":
        columns = sorted({k for row in rows for k in row})
        with path.open("w", newline="", encoding="utf-8") as fp:
            writer = csv.DictWriter(fp, columns)
            writer.writeheader()
            # Cells of lists and objects hold JSON, as in a zsched export.
            writer.writerows({k: v if isinstance(v, str) else json.dumps(v)
                              for k, v in row.items()} for row in rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


def _run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _definitions() -> dict[str, Job]:
    return {row.job_id: row.to_job() for row in ZSchedJob.objects.all()}


def _redis_snapshot(client: redis.Redis, store: Store) -> dict[str, Any]:
    return {key: client.dump(key) for key in store.keys.all()}


@pytest.mark.parametrize("suffix", [".json", ".csv", ".jsonl"])
def test_export_then_import_round_trips_every_definition(
        tmp_path: Path, zstore: Store, suffix: str) -> None:
    rows = [
        *_rows(5),
        {"id": "cron-job", "task": "tasks.report", "cron": "*/15 * * * *",
         "timezone": "America/New_York", "kwargs": {"a": [1, "x"]}, "queue": "reports",
         "priority": 3, "enabled": False, "start_at": "2030-01-01T00:00:00Z"},
        {"id": "once-job", "task": "tasks.once", "run_at": "2031-06-01T09:00:00+02:00",
         "args": [1, 2], "meta": {"k": "v"}, "name": "Once, with \"quotes\""},
    ]
    src = _write(tmp_path / f"in{suffix}", rows)
    _run("zsched_import", "--file", str(src))
    before = _definitions()
    assert len(before) == 7

    exported = tmp_path / f"out{suffix}"
    _out, err = _run("zsched_export", "--file", str(exported))
    assert "exported 7 job(s)" in err
    ZSchedJob.objects.all().delete()
    _run("zsched_import", "--file", str(exported))
    assert _definitions() == before

    again = tmp_path / f"again{suffix}"
    _run("zsched_export", "--file", str(again))
    assert again.read_text() == exported.read_text()


def test_export_to_stdout_defaults_to_json_lines(make_row: Callable[..., ZSchedJob]) -> None:
    make_row(1)
    out, _err = _run("zsched_export")
    assert [json.loads(line)["url"] for line in out.splitlines()] == ["http://127.0.0.1:1/page/1"]


def test_import_is_staggered_in_redis_and_shows_progress(tmp_path: Path, zstore: Store,
                                                         rclient: redis.Redis) -> None:
    out, err = _run("zsched_import", "--file", str(_write(tmp_path / "a.jsonl", _rows(100))))
    assert "create: 100" in out
    assert "database" in err and "redis" in err and "100/100" in err
    assert ZSchedJob.objects.count() == 100
    dues = sorted(s for _, s in rclient.zrange(zstore.keys.schedule, 0, -1, withscores=True))
    assert len(dues) == 100 and dues[-1] - dues[0] >= 50_000


@pytest.mark.parametrize(("name", "text", "where"), [
    ("bad.json", '[\n {"url": "http://127.0.0.1:1/a"},\n {"url": "http://127.0.0.1:1/b",'
                 ' "cron": "99 * * * *"},\n {"url": "http://127.0.0.1:1/c"}\n]',
     "job 2 (url 'http://127.0.0.1:1/b'):"),
    ("bad.csv", "url,interval_s\nhttp://127.0.0.1:1/a,60\nhttp://127.0.0.1:1/b,-5\n"
                "http://127.0.0.1:1/c,60\n", "job 2 (line 3, url 'http://127.0.0.1:1/b'):"),
    ("bad.jsonl", '{"url": "http://127.0.0.1:1/a"}\n{"url": "nope"}\n',
     "job 2 (line 2, url 'nope'):"),
])
def test_a_bad_row_is_reported_by_job_and_nothing_is_written(
        tmp_path: Path, zstore: Store, rclient: redis.Redis,
        make_row: Callable[..., ZSchedJob], name: str, text: str, where: str) -> None:
    make_row(99)
    before_db, before_redis = _definitions(), _redis_snapshot(rclient, zstore)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CommandError) as info:
        _run("zsched_import", "--file", str(path))
    assert where in str(info.value)
    assert "nothing was written" in str(info.value)
    assert _definitions() == before_db
    assert _redis_snapshot(rclient, zstore) == before_redis


def test_malformed_file_is_a_command_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"url": "http://127.0.0.1:1/a"},\n{"url": ', encoding="utf-8")
    with pytest.raises(CommandError, match="malformed JSON"):
        _run("zsched_import", "--file", str(path))
    assert not ZSchedJob.objects.exists()


def test_skip_invalid_imports_the_good_rows_and_reports_the_bad(tmp_path: Path,
                                                                zstore: Store) -> None:
    rows = _rows(3)
    rows[1]["timezone"] = "Nowhere/Land"
    out, _err = _run("zsched_import", "--skip-invalid", "--file",
                     str(_write(tmp_path / "a.json", rows)))
    assert "valid: 2, invalid (skipped): 1" in out
    assert "job 2 (url 'http://127.0.0.1:1/page/1'): timezone" in out
    assert ZSchedJob.objects.count() == 2 == zstore.stats()["jobs"]


def test_existing_ids_are_skipped_unless_update(tmp_path: Path, zstore: Store) -> None:
    _run("zsched_import", "--file", str(_write(tmp_path / "a.csv", _rows(3))))
    due_before = {info.job.id: info.due_ms for info in zstore.list_jobs()}
    changed = _write(tmp_path / "b.csv", _rows(4, queue="q2"))

    out, _err = _run("zsched_import", "--file", str(changed))
    assert "create: 1" in out and "skipped (use --update to update them): 3" in out
    assert ZSchedJob.objects.filter(queue="q2").count() == 1

    out, _err = _run("zsched_import", "--update", "--file", str(changed))
    assert "create: 0" in out and "update: 3 (unchanged: 1)" in out
    assert ZSchedJob.objects.filter(queue="q2").count() == 4
    stamp = ZSchedJob.objects.order_by("pk").values_list("updated_at", flat=True)[0]
    out, _err = _run("zsched_import", "--update", "--file", str(changed))
    assert "update: 0 (unchanged: 4)" in out
    assert ZSchedJob.objects.order_by("pk").values_list("updated_at", flat=True)[0] == stamp
    assert all(info.job.queue == "q2" for info in zstore.list_jobs())
    # Same timing: the schedules did not move.
    due_after = {info.job.id: info.due_ms for info in zstore.list_jobs()}
    assert all(due_after[k] == v for k, v in due_before.items())


def test_dry_run_writes_nothing(tmp_path: Path, zstore: Store, rclient: redis.Redis) -> None:
    out, _err = _run("zsched_import", "--dry-run", "--file",
                     str(_write(tmp_path / "a.json", _rows(4))))
    assert "would create: 4" in out
    assert not ZSchedJob.objects.exists()
    assert rclient.hlen(zstore.keys.defs) == 0


def test_zsched_sync_command_rebuilds_a_wiped_redis(tmp_path: Path, zstore: Store,
                                                    rclient: redis.Redis) -> None:
    _run("zsched_import", "--file", str(_write(tmp_path / "a.json", _rows(6))))
    rclient.flushall()
    out, _err = _run("zsched_sync", "--dry-run")
    assert "would add to Redis (staggered): 6" in out
    assert rclient.dbsize() == 0
    out, err = _run("zsched_sync")
    assert "add to Redis (staggered): 6" in out
    assert "compare" in err and "redis" in err and "6/6" in err
    assert zstore.stats()["scheduled"] == 6


def test_zsched_drain_and_stats_commands(zstore: Store,
                                         make_row: Callable[..., ZSchedJob]) -> None:
    make_row(1)
    make_row(2, cron="0 * * * *", interval_s=None)
    for c in zstore.claim().jobs:
        zstore.settle(c.job.id, c.occurrence, c.attempt, "complete",
                      event={"lateness_ms": 7, "wait_ms": 3, "duration_ms": 11})
    out, _err = _run("zsched_drain")
    assert "recorded 1 run(s)" in out
    assert ZSchedRun.objects.count() == 1

    out, _err = _run("zsched_stats", "--json")
    stats = json.loads(out)
    assert stats["redis"]["jobs"] == 2
    assert stats["database"]["by_kind"] == {"cron": 1, "interval": 1}
    assert stats["lateness_ms"]["p50"] == 7 and stats["duration_ms"]["p99"] == 11
    assert stats["window"]["source"] == "run history"
    text, _err = _run("zsched_stats")
    assert "lateness_ms: p50 7" in text and "Dead letters: 0" in text


def test_verbosity_0_silences_the_summaries(tmp_path: Path, zstore: Store) -> None:
    """``-v 0``: import, sync, drain and export print nothing when all goes well."""
    path = _write(tmp_path / "a.jsonl", _rows(3))
    assert _run("zsched_import", "-v", "0", "--file", str(path)) == ("", "")
    assert ZSchedJob.objects.count() == 3 == zstore.stats()["jobs"]
    assert _run("zsched_sync", "-v", "0") == ("", "")
    assert _run("zsched_drain", "-v", "0") == ("", "")
    assert _run("zsched_export", "-v", "0", "--file", str(tmp_path / "out.json")) == ("", "")
    assert len(json.loads((tmp_path / "out.json").read_text("utf-8"))) == 3
    # At the default verbosity each still reports what it did.
    assert _run("zsched_sync")[0]
    assert _run("zsched_drain")[0].startswith("read ")
    assert _run("zsched_export", "--file", str(tmp_path / "out.json"))[1].startswith(
        "exported 3 job(s)")


def test_stats_fall_back_to_the_event_stream(zstore: Store,
                                             make_row: Callable[..., ZSchedJob]) -> None:
    make_row(1)
    for c in zstore.claim().jobs:
        zstore.settle(c.job.id, c.occurrence, c.attempt, "complete",
                      event={"lateness_ms": 9})
    stats = json.loads(_run("zsched_stats", "--json")[0])
    assert stats["window"]["source"] == "event stream"
    assert stats["lateness_ms"]["p95"] == 9


def test_redis_down_is_a_command_error(settings: Any, tmp_path: Path) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"
    for command in ("zsched_sync", "zsched_drain", "zsched_stats"):
        with pytest.raises(CommandError, match="Redis unreachable"):
            _run(command)
    with pytest.raises(CommandError, match="zsched_sync"):
        _run("zsched_import", "--file", str(_write(tmp_path / "a.json", _rows(2))))
    assert ZSchedJob.objects.count() == 2, "the rows are kept for zsched_sync"


def test_update_writes_json_and_time_fields_exactly(tmp_path: Path, zstore: Store) -> None:
    _run("zsched_import", "--file", str(_write(tmp_path / "a.json", _rows(2))))
    new = _rows(2, meta={"tags": ["x", "y"], "n": 1.5}, start_at="2030-01-01T12:00:00+01:00",
                enabled=False, kwargs={"deep": {"a": None}})
    _run("zsched_import", "--update", "--file", str(_write(tmp_path / "b.json", new)))
    got = {row.url: row.to_job() for row in ZSchedJob.objects.all()}
    for data in new:
        assert got[data["url"]] == Job.from_dict(data, conf.get_defaults())
    infos = zstore.get_many([job.id for job in got.values()])
    assert all(info and info.paused and info.job == got[info.job.url or ""] for info in infos)
