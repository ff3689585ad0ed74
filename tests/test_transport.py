"""The ``transport`` job field: validated, settable everywhere jobs are defined, and
honoured by every store operation (HTTP jobs wait in their own schedule)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import ImportValidationError, ValidationError
from celery_zsched.core.formats import read_rows
from celery_zsched.core.job import Job
from celery_zsched.core.rows import write_rows
from celery_zsched.services.importer import import_file
from celery_zsched.store import Store, audit_log
from celery_zsched.store.keys import partition_of
from celery_zsched.store.repartition import repartition
from tests.cli_env import cli_prefix, invoke


def _job(job_id: str, transport: str = "http", **fields: object) -> Job:
    return Job.from_dict({"id": job_id, "url": f"http://t.invalid/{job_id}",
                          "transport": transport, "interval_s": 60, "jitter_s": 0, **fields})


def _where(store: Store, job_id: str) -> str | None:
    """Which schedule holds ``job_id``: "beat", "http" or None."""
    k, c = store.keys, store.client
    if c.zscore(k.schedule, job_id) is not None:
        return "beat"
    return "http" if c.zscore(k.http_schedule, job_id) is not None else None


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(("raw", "value"), [
    (None, "celery"), ("", "celery"), ("http", "http"), (" HTTP ", "http"),
    ("celery", "celery")])
def test_transport_defaults_to_celery_and_is_normalised(raw: str | None, value: str) -> None:
    data = {"id": "a", "task": "t", "transport": raw}
    assert Job.from_dict(data).transport == value


@pytest.mark.parametrize("raw", ["grpc", 1, True, ["http"]])
def test_an_unknown_transport_is_refused_naming_the_field_and_row(raw: object) -> None:
    with pytest.raises(ValidationError) as info:
        Job.from_dict({"id": "a", "task": "t", "transport": raw}, row=7)
    assert info.value.field == "transport" and info.value.row == 7
    assert "http" in str(info.value)


def test_the_default_transport_is_left_out_of_the_stored_definition() -> None:
    """Definitions stored before the field existed are unchanged (celery)."""
    assert "transport" not in json.loads(_job("c", "celery").to_json())
    http = _job("h")
    assert json.loads(http.to_json())["transport"] == "http"
    assert Job.from_json(http.to_json()) == http


# --------------------------------------------------------------------- import
def test_import_reads_transport_from_json_and_csv_and_export_writes_it(
        store: Store, tmp_path: Path) -> None:
    (tmp_path / "jobs.json").write_text(json.dumps([
        {"url": "http://t.invalid/a", "transport": "http"},
        {"url": "http://t.invalid/b"}]))
    (tmp_path / "jobs.csv").write_text("url,transport\nhttp://t.invalid/c,http\n"
                                       "http://t.invalid/d,\n")
    import_file(store, tmp_path / "jobs.json")
    import_file(store, tmp_path / "jobs.csv")
    by_url = {job.url: job for job in store.iter_jobs()}
    assert {url[-1]: job.transport for url, job in by_url.items() if url} == {
        "a": "http", "b": "celery", "c": "http", "d": "celery"}
    assert {_where(store, j.id) for j in by_url.values() if j.transport == "http"} == {"http"}
    out = tmp_path / "out.csv"
    with out.open("w") as fp:
        write_rows(store.iter_jobs(), fp, "csv")
    assert sorted(row.data.get("transport", "") for row in read_rows(out)) == [
        "", "", "http", "http"]


def test_a_bad_transport_in_an_import_names_the_row_and_writes_nothing(
        store: Store, tmp_path: Path) -> None:
    (tmp_path / "jobs.csv").write_text("url,transport\nhttp://t.invalid/a,http\n"
                                       "http://t.invalid/b,smoke-signals\n")
    with pytest.raises(ImportValidationError) as info:
        import_file(store, tmp_path / "jobs.csv")
    assert "(line 3," in str(info.value) and "transport: must be" in str(info.value)
    assert store.client.hlen(store.keys.defs) == 0


# ------------------------------------------------------------------------ CLI
@pytest.fixture
def cli_store(redis_url: str, monkeypatch: pytest.MonkeyPatch,
              make_store: Callable[..., Store]) -> Iterator[Store]:
    for prefix in cli_prefix(redis_url, monkeypatch, "tr"):
        yield make_store(key_prefix=prefix)


def test_cli_add_takes_a_transport(cli_store: Store) -> None:
    res = invoke("add", "--url", "http://t.invalid/x", "--transport", "http")
    assert res.exit_code == 0, res.output
    (job,) = cli_store.iter_jobs()
    assert job.transport == "http" and _where(cli_store, job.id) == "http"
    res = invoke("add", "--url", "http://t.invalid/y", "--transport", "carrier-pigeon")
    assert res.exit_code != 0 and "transport" in res.output


# ---------------------------------------------------------------- operations
def test_every_control_keeps_an_http_job_in_the_http_schedule(store: Store) -> None:
    store.upsert(_job("h"))
    assert _where(store, "h") == "http"
    store.pause("h")
    assert _where(store, "h") is None and store.get("h").paused
    store.resume("h")
    assert _where(store, "h") == "http"
    store.run_now("h")
    assert store.client.zscore(store.keys.http_schedule, "h") <= store.now_ms()
    info = store.get("h")
    assert info.due_ms is not None and info.status == "scheduled"
    assert [i.job.id for i in store.list_jobs()] == ["h"]
    stats = store.stats()
    assert stats["scheduled"] == 1 and stats["http_scheduled"] == 1 and stats["due_now"] == 1
    assert store.peek_next_due() == info.due_ms
    store.delete("h")
    assert _where(store, "h") is None and store.client.hlen(store.keys.defs) == 0


def test_changing_the_transport_moves_a_waiting_job_at_the_same_due_time(store: Store) -> None:
    store.upsert(_job("m", "celery"))
    due = store.client.zscore(store.keys.schedule, "m")
    store.upsert(_job("m", "http"))
    assert _where(store, "m") == "http"
    assert store.client.zscore(store.keys.http_schedule, "m") == due
    store.upsert(_job("m", "celery"))
    assert _where(store, "m") == "beat" and store.client.zscore(store.keys.schedule, "m") == due


def test_transport_changes_and_http_job_controls_are_in_the_audit_trail(store: Store) -> None:
    """A change of transport is an edit whose diff says so; the controls of an HTTP
    job are recorded as any job's (newest first)."""
    ops = Actor("cli", "ops@host")
    store.upsert(_job("a", "celery"), by=ops)
    store.upsert(_job("a", "http"), by=ops, note="to the Go workers")
    assert _where(store, "a") == "http"
    store.pause("a", by=ops)
    store.resume("a", by=ops)
    store.delete("a", by=ops, note="retired")
    delete, resume, pause, edit, create = audit_log.history(store, "a")
    assert [c.action for c in (create, edit, pause, resume, delete)] == [
        "create", "edit", "pause", "resume", "delete"]
    assert "transport" not in create.diff  # the default, left out of the definition
    assert edit.diff == {"transport": ["celery", "http"]} and edit.note == "to the Go workers"
    assert pause.diff == {"enabled": [True, False]} and resume.diff == {"enabled": [False, True]}
    assert delete.diff["transport"] == ["http", None] and delete.note == "retired"
    assert {c.actor for c in (create, edit, pause, resume, delete)} == {ops}


def test_settle_and_reap_put_an_http_job_back_in_the_http_schedule(make_store: Callable[..., Store]
                                                                   ) -> None:
    store = make_store(gateway_lease_s=0.001)
    store.upsert(_job("s"))
    (claimed,) = store.claim_http(10).jobs
    assert _where(store, "s") is None
    result = store.settle("s", claimed.occurrence, claimed.attempt, "complete")
    assert result.applied and _where(store, "s") == "http"
    store.run_now("s")
    (again,) = store.claim_http(10).jobs
    time.sleep(0.01)  # a reap in the claim's own millisecond finds the lease unexpired
    assert store.reap().redelivered == 1  # its (1 ms) lease ended unreported
    assert _where(store, "s") == "http"
    assert store.claim_http(10).jobs[0].occurrence == again.occurrence


def test_wake_ups_are_published_when_an_http_job_falls_due_sooner(store: Store) -> None:
    pubsub = store.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.http_wake)
    now = store.now_ms()
    store.upsert(_job("late", run_at=now / 1000 + 3600, interval_s=None))
    store.upsert(_job("later", run_at=now / 1000 + 7200, interval_s=None))
    store.upsert(_job("celery-job", "celery"))

    def published() -> list[int]:
        out, deadline = [], time.monotonic() + 0.3
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.05)  # None too for the subscribe reply
            if message is not None:
                out.append(int(float(message["data"])))
        return out

    # The first one is the earliest; the second falls due after it; Celery jobs never wake.
    assert published() == [now + 3_600_000]
    store.run_now("later")
    assert len(published()) == 1
    pubsub.close()


def test_repartitioning_keeps_http_jobs_in_the_http_schedule(
        make_store: Callable[..., Store]) -> None:
    store = make_store()
    store.upsert_many([_job(f"h{i}") for i in range(20)] + [_job("c", "celery")],
                      stagger=False)
    dues = {f"h{i}": store.client.zscore(store.keys.http_schedule, f"h{i}") for i in range(20)}
    repartition(store.client, store.settings, 3)
    moved = Store(store.client, dataclasses.replace(store.settings, partitions=3))
    for job_id, due in dues.items():
        keys = moved.part_of(job_id)
        assert moved.client.zscore(keys.http_schedule, job_id) == due
        assert moved.client.zscore(keys.schedule, job_id) is None
    assert moved.client.zscore(moved.part_of("c").schedule, "c") is not None
    # The gateway claims across partitions.
    assert len(moved.claim_http(50).jobs) == 20


def test_the_gateway_finds_a_single_due_job_in_any_partition(
        make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=3)
    store.upsert_many([_job(f"p{i}") for i in range(10)], stagger=False)
    assert len({partition_of(f"p{i}", 3) for i in range(10)}) == 3
    taken = [store.claim_http(1).jobs for _ in range(12)]
    assert sorted(job.job.id for jobs in taken for job in jobs) == sorted(
        f"p{i}" for i in range(10))
    assert [len(jobs) for jobs in taken[10:]] == [0, 0]


def test_the_exporter_counts_http_jobs_and_their_backlog(store: Store) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from celery_zsched.metrics.exporter import StoreCollector

    store.upsert_many([_job("h1"), _job("h2"), _job("c", "celery")], stagger=False)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    text = generate_latest(registry).decode()
    assert 'zsched_jobs{state="scheduled"} 3.0' in text
    assert "zsched_http_due_backlog 2.0" in text
    assert "zsched_due_backlog 1.0" in text
