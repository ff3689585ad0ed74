"""``celery -A tests.cli_app zsched dead [list|show|requeue|purge]`` against real Redis.

Dead letters are made as a fleet makes them (tests/dead_letters.py): a job
fails once, runs again, its worker dies, and the reaper gives up after one
crash. Every rejected command is checked to have written nothing, and every
action to be one pipeline over the selection, partitions included. The
last tests show that a re-import and a beat restart keep dead letters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from celery_zsched.core.rows import write_rows
from celery_zsched.core.state import RuntimeState
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke
from tests.dead_letters import dead_job, kill

ERROR = "HTTP 503: upstream down"

Run = Callable[..., Result]


@pytest.fixture(params=[1, 3], ids=["one-partition", "three-partitions"])
def partitions(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def prefix(redis_url: str, partitions: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh key prefix (and partition count), passed to the app through ``ZSCHED_*``."""
    yield from cli_prefix(redis_url, monkeypatch, "dead", partitions=partitions)


@pytest.fixture
def run(prefix: str) -> Run:
    """Invoke ``celery -A tests.cli_app zsched ARGS`` (``input`` answers prompts)."""
    return invoke


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str, partitions: int) -> Store:
    """The store the CLI reads, with a lease that runs out at once and one crash to die."""
    return make_store(key_prefix=prefix, partitions=partitions, lease_s=0.05, max_deliveries=1)


def state(store: Store, job_id: str) -> RuntimeState:
    return store.get(job_id).state


def dead_set(store: Store) -> set[str]:
    return {str(m) for keys in store.parts for m in store.client.zrange(keys.dead, 0, -1)}


def snapshot(store: Store) -> list[dict[str, Any]]:
    """What a write could change, in every partition (states decoded: cjson may
    write the same state with its keys in another order)."""
    c = store.client
    return [{"defs": c.hgetall(k.defs),
             "state": {i: RuntimeState.from_wire(raw) for i, raw in c.hgetall(k.state).items()},
             "schedule": c.zrange(k.schedule, 0, -1, withscores=True),
             "queued": c.zrange(k.queued, 0, -1, withscores=True),
             "leases": c.zrange(k.leases, 0, -1, withscores=True),
             "paused": c.smembers(k.paused),
             "dead": c.zrange(k.dead, 0, -1, withscores=True),
             "static": c.smembers(k.static)} for k in store.parts]


def count_pipelines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of script calls of each ``Store._run`` (one pipeline each)."""
    calls: list[int] = []
    original = Store._run

    def counted(self: Store, batch: Any) -> list[Any]:
        calls.append(len(batch))
        return original(self, batch)
    monkeypatch.setattr(Store, "_run", counted)
    return calls


# -------------------------------------------------------------------- reads
def test_list_shows_each_dead_letter_newest_first(run: Run, zstore: Store) -> None:
    assert run("dead", "list").output.strip() == "no dead letters"
    kill(zstore, [dead_job("old")])
    time.sleep(0.01)
    kill(zstore, [dead_job("new", url=None, name=None)])
    result = run("dead", "list")
    assert result.exit_code == 0, result.output
    header, first, second = result.output.splitlines()
    for column in ("ID", "DIED (UTC)", "DELIVERIES", "TASK", "NAME / URL", "LAST ERROR"):
        assert column in header
    assert first.startswith("new ") and second.startswith("old ")
    assert "job old https://example.test/old" in second and "tests.noop" in second
    assert ERROR in second and "s ago)" in second and "Z (" in second

    rows = json.loads(run("dead", "list", "--json").output)
    assert [r["id"] for r in rows] == ["new", "old"]
    old = rows[1]
    assert (old["name"], old["url"], old["task"], old["deliveries"], old["last_error"],
            old["status"]) == ("job old", "https://example.test/old", "tests.noop", 1,
                               ERROR, "dead")
    assert old["died_at"].endswith("Z") and old["died_ago"].endswith(" ago")

    limited = run("dead", "list", "--limit", "1").output.splitlines()
    assert limited[1].startswith("new ") and limited[-1] == "... 1 more (--limit)"


def test_show_prints_one_dead_letter_or_exits_1(run: Run, zstore: Store) -> None:
    kill(zstore, [dead_job("a", name="nightly")], error="Traceback\n  boom\nRuntimeError: x")
    zstore.upsert(dead_job("alive"))
    shown = json.loads(run("dead", "show", "a", "--json").output)
    assert shown["last_error"] == "Traceback\n  boom\nRuntimeError: x"
    assert (shown["name"], shown["deliveries"]) == ("nightly", 1)
    text = run("dead", "show", "a").output
    assert "deliveries:  1" in text and "died_at:" in text and " ago)" in text
    for job_id in ("alive", "nope"):
        result = run("dead", "show", job_id)
        assert result.exit_code == 1
        assert f"{job_id} is not dead-lettered" in result.output


# ------------------------------------------------------------------ requeue
def test_requeue_makes_jobs_due_now_with_counters_reset(
        run: Run, zstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    kill(zstore, [dead_job(f"j{n}") for n in range(5)])
    zstore.pause("j1")  # a dead job that was also paused: requeue runs it anyway
    calls = count_pipelines(monkeypatch)
    result = run("dead", "requeue", "j0", "j1", "j2")
    assert result.exit_code == 0, result.output
    assert "requeued 3 of 3 dead letter(s)" in result.output
    assert len(calls) == 1  # one pipeline, one script call per partition holding some
    assert calls[0] == len(zstore.group(["j0", "j1", "j2"]))
    assert dead_set(zstore) == {"j3", "j4"}
    now = zstore.now_ms()
    for job_id in ("j0", "j1", "j2"):
        info = zstore.get(job_id)
        st = info.state
        assert (info.status, info.paused) == ("scheduled", False)
        assert info.due_ms is not None and info.due_ms <= now
        assert (st.crashes, st.attempt, st.publishes, st.consecutive_failures) == (0, 1, 0, 0)
        # History stays: what killed it, and the all-time failures.
        assert (st.last_error, st.failures) == (ERROR, 1)
    claimed = {c.job.id for c in zstore.claim(100).jobs}
    assert claimed == {"j0", "j1", "j2"}


def test_requeue_all_and_rejections_write_nothing(run: Run, zstore: Store) -> None:
    kill(zstore, [dead_job(f"j{n}") for n in range(4)])
    zstore.upsert(dead_job("alive"))
    before = snapshot(zstore)
    for args, code, message in (
            (("j0", "alive"), 1, "not dead-lettered: alive; nothing changed"),
            (("j0", "nope"), 1, "not dead-lettered: nope; nothing changed"),
            ((), 2, "give dead-lettered IDs or --all"),
            (("j0", "--all"), 2, "give dead-lettered IDs or --all")):
        result = run("dead", "requeue", *args)
        assert result.exit_code == code, result.output
        assert message in result.output
    assert snapshot(zstore) == before
    result = run("dead", "requeue", "--all")
    assert "requeued 4 of 4" in result.output
    assert dead_set(zstore) == set()
    assert run("dead", "requeue", "--all").output.strip().startswith("requeued 0 of 0")


def test_the_control_ops_leave_jobs_that_are_not_dead_alone(zstore: Store) -> None:
    """requeue/purge act on dead letters only: a job requeued, resumed or running
    a moment before the operator's click keeps what it has."""
    kill(zstore, [dead_job("d")])
    zstore.upsert(dead_job("alive"))
    zstore.pause("alive")
    before = snapshot(zstore)
    assert zstore.requeue_dead("alive") == 0
    assert zstore.purge_dead("alive") == 0
    assert snapshot(zstore) == before
    assert zstore.requeue_dead("d") == 1
    assert zstore.requeue_dead("d") == 0  # a second click changes nothing
    assert zstore.purge_dead("d") == 0


# -------------------------------------------------------------------- purge
def test_purge_drops_the_dead_letter_and_keeps_the_job_paused(
        run: Run, zstore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    kill(zstore, [dead_job(f"j{n}") for n in range(4)])
    calls = count_pipelines(monkeypatch)
    result = run("dead", "purge", "j0", "j1")
    assert result.exit_code == 0, result.output
    assert "purged 2 of 2 dead letter(s); their jobs are paused" in result.output
    assert len(calls) == 1
    assert dead_set(zstore) == {"j2", "j3"}
    for job_id in ("j0", "j1"):
        info = zstore.get(job_id)
        assert (info.status, info.paused, info.due_ms) == ("paused", True, None)
        assert info.job.url == f"https://example.test/{job_id}"  # the definition stays
        assert info.state.crashes == 0
    assert zstore.claim(100).jobs == []
    # Resume runs a purged job again, at its next regular run.
    assert zstore.resume("j0") == 1
    assert zstore.get("j0").status == "scheduled"


def test_purge_all_asks_unless_yes(run: Run, zstore: Store) -> None:
    kill(zstore, [dead_job(f"j{n}") for n in range(3)])
    before = snapshot(zstore)
    result = run("dead", "purge", "--all", input="n\n")
    assert result.exit_code == 1 and "purge all 3 dead letter(s)" in result.output
    assert snapshot(zstore) == before
    assert run("dead", "purge", "j0", "nope").exit_code == 1
    assert snapshot(zstore) == before
    result = run("dead", "purge", "--all", "--yes")
    assert "purged 3 of 3" in result.output
    assert dead_set(zstore) == set()
    assert {zstore.get(f"j{n}").status for n in range(3)} == {"paused"}


# ------------------------------------------------------ nothing loses them
def test_a_reimport_of_the_same_file_keeps_dead_letters(run: Run, zstore: Store,
                                                        tmp_path: Path) -> None:
    jobs = [dead_job(f"j{n}") for n in range(3)]
    kill(zstore, jobs)
    path = tmp_path / "jobs.jsonl"
    with path.open("w", encoding="utf-8") as fp:
        write_rows(jobs, fp, "jsonl")
    before = {j.id: (zstore.get(j.id).state, zstore.get(j.id).due_ms) for j in jobs}
    result = run("import", "-f", str(path))
    assert result.exit_code == 0, result.output
    # An edited timing is imported too, and still does not revive a dead job.
    with path.open("w", encoding="utf-8") as fp:
        write_rows([dead_job(j.id, interval_s=60) for j in jobs], fp, "jsonl")
    assert run("import", "-f", str(path)).exit_code == 0
    assert dead_set(zstore) == {j.id for j in jobs}
    for job in jobs:
        info = zstore.get(job.id)
        assert (info.status, info.due_ms) == ("dead", None)
        old_state, _ = before[job.id]
        assert (info.state.crashes, info.state.last_error) == (1, old_state.last_error)
    assert {r["id"] for r in json.loads(run("dead", "list", "--json").output)} == {
        j.id for j in jobs}


def test_a_beat_restart_keeps_dead_letters(make_store: Callable[..., Store], zstore: Store,
                                           prefix: str, partitions: int) -> None:
    """A restarted beat is a new store that upserts its static schedule and reaps."""
    static = dead_job("static")
    zstore.upsert(static, static=True)
    kill(zstore, [static, dead_job("dynamic")])
    before = snapshot(zstore)
    again = make_store(key_prefix=prefix, partitions=partitions, lease_s=0.05,
                       max_deliveries=1)
    again.upsert_many([static], stagger=False, static=True)
    assert again.reap().dead == 0
    assert again.claim(100).jobs == []
    assert dead_set(again) == {"static", "dynamic"}
    assert {again.get(i).status for i in ("static", "dynamic")} == {"dead"}
    assert snapshot(again) == before
