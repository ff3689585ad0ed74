"""``zsched history ID``, and the CLI recording its changes as ``cli`` (or ``import``)
with the note it was given, against real Redis."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result

from celery_zsched.core import audit
from celery_zsched.core.audit import Actor
from celery_zsched.store import Store, audit_log
from tests.cli_env import cli_prefix, invoke
from tests.dead_letters import dead_job, kill

Run = Callable[..., Result]
ME = audit.local_user()


@pytest.fixture(params=[1, 3], ids=["one-partition", "three-partitions"])
def partitions(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def prefix(redis_url: str, partitions: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "hist", partitions=partitions)


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str, partitions: int) -> Store:
    return make_store(key_prefix=prefix, partitions=partitions, lease_s=0.05, max_deliveries=1)


@pytest.fixture
def run(prefix: str) -> Run:
    def call(*args: str) -> Result:
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        return result
    return call


def recorded(store: Store, job_id: str) -> list[tuple[str, Actor, str]]:
    return [(c.action, c.actor, c.note) for c in audit_log.history(store, job_id, 100)]


def test_each_cli_change_is_recorded_as_the_user_with_its_note(run: Run, zstore: Store) -> None:
    run("add", "--id", "p", "--task", "t", "--interval", "3600", "--note", "new feed")
    run("add", "--id", "p", "--task", "t", "--interval", "600")
    run("pause", "p", "--note", "site maintenance")
    run("resume", "p", "--note", "maintenance over")
    run("run-now", "p")
    run("delete", "p", "--note", "feed retired")
    cli = Actor("cli", ME)
    assert recorded(zstore, "p") == [
        ("delete", cli, "feed retired"), ("run_now", cli, ""),
        ("resume", cli, "maintenance over"), ("pause", cli, "site maintenance"),
        ("edit", cli, ""), ("create", cli, "new feed")]
    edit = audit_log.history(zstore, "p")[4]
    assert edit.diff == {"interval_s": [3600, 600]}


def test_dead_letter_requeue_and_purge_take_a_note(run: Run, zstore: Store) -> None:
    kill(zstore, [dead_job("d1"), dead_job("d2")])
    run("dead", "requeue", "d1", "--note", "upstream fixed")
    run("dead", "purge", "d2", "--note", "target gone")
    assert recorded(zstore, "d1")[0] == ("requeue", Actor("cli", ME), "upstream fixed")
    assert recorded(zstore, "d2")[0] == ("purge", Actor("cli", ME), "target gone")


def test_a_file_import_is_recorded_as_an_import_and_a_reimport_records_nothing(
        run: Run, zstore: Store, tmp_path: Path) -> None:
    path = tmp_path / "feeds.csv"
    path.write_text("id,url,interval_s\na,https://x.example/a,60\nb,https://x.example/b,60\n")
    run("import", "--file", str(path))
    run("import", "--file", str(path))
    path.write_text("id,url,interval_s\na,https://x.example/a,90\nb,https://x.example/b,60\n")
    run("import", "--file", str(path))
    by = Actor("import", f"{ME}:feeds.csv")
    assert recorded(zstore, "a") == [("edit", by, ""), ("create", by, "")]
    assert recorded(zstore, "b") == [("create", by, "")]


def test_history_prints_newest_first_with_utc_and_local_times(run: Run, zstore: Store) -> None:
    run("add", "--id", "h", "--task", "t", "--interval", "60", "--name", "first")
    run("add", "--id", "h", "--task", "t", "--interval", "60", "--name", "second")
    run("pause", "h", "--note", "too eager")
    lines = run("history", "h").stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+\)"
    assert re.fullmatch(stamp + rf"  pause  by cli:{re.escape(ME)}", lines[0])
    assert lines[1:3] == ["    note: too eager", "    enabled: true -> false"]
    assert re.fullmatch(stamp + r"  edit  by cli:\S+", lines[3])
    assert lines[4] == '    name: "first" -> "second"'
    assert re.fullmatch(stamp + r"  create  by cli:\S+", lines[5])
    assert '    name: - -> "first"' in lines
    assert len(run("history", "h", "-n", "1").stdout.splitlines()) == 3


def test_history_json(run: Run, zstore: Store) -> None:
    run("add", "--id", "j", "--task", "t", "--interval", "60")
    run("pause", "j", "--note", "why")
    data = json.loads(run("history", "j", "--json").stdout)
    assert [d["action"] for d in data] == ["pause", "create"]
    pause = data[0]
    assert (pause["actor_kind"], pause["actor_name"], pause["note"], pause["diff"]) == (
        "cli", ME, "why", {"enabled": [True, False]})
    assert pause["at"].endswith("Z") and isinstance(pause["at_ms"], int)
    assert data[1]["diff"]["interval_s"] == [None, 60]


def test_history_of_a_deleted_job_is_still_there_and_of_an_unknown_id_is_an_error(
        run: Run, zstore: Store) -> None:
    run("add", "--id", "g", "--task", "t", "--interval", "60")
    run("delete", "g")
    assert "delete" in run("history", "g").stdout
    result = invoke("history", "never-was")
    assert result.exit_code == 1
    assert "never-was" in result.output


def test_a_note_too_long_is_refused_naming_the_field_and_changes_nothing(
        run: Run, zstore: Store) -> None:
    run("add", "--id", "n", "--task", "t", "--interval", "60")
    result = invoke("pause", "n", "--note", "x" * 1001)
    assert result.exit_code == 65
    assert "note: must be at most 1000 characters (got '1001 characters')" in result.output
    assert not zstore.get("n").paused
    assert [c.action for c in audit_log.history(zstore, "n")] == ["create"]
