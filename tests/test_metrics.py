"""Prometheus metrics: beat's own (a real tick), and ``zsched exporter`` scraped over HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.config import Settings
from celery_zsched.core.job import Job
from celery_zsched.metrics import BeatMetrics
from celery_zsched.metrics.exporter import StoreCollector, serve
from celery_zsched.store import Store
from tests.helpers import free_port, settle_all, wait

ROOT = Path(__file__).resolve().parent.parent
CELERY = Path(sys.executable).with_name("celery")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """``/metrics`` on 127.0.0.1:``port``, as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _job(job_id: str, **fields: Any) -> Job:
    data: dict[str, Any] = {"id": job_id, "task": "tests.noop", "interval_s": 3600,
                            "jitter_s": 0}
    data.update(fields)
    return Job.from_dict(data)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ZSCHED_"):
            monkeypatch.delenv(name)


@pytest.fixture
def servers() -> Iterator[Callable[..., int]]:
    """Start exporters on free ports (shut down at teardown); returns the port."""
    started: list[Any] = []

    def start(store: Store, **kwargs: Any) -> int:
        port = free_port()
        server, _thread = serve(store, port, **kwargs)
        started.append(server)
        return port
    yield start
    for server in started:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------- beat
def test_beat_metrics_after_real_ticks(make_settings: Callable[..., Settings],
                                       rclient: redis.Redis, redis_url: str) -> None:
    settings = make_settings()
    port = free_port()
    app = Celery("metrics-tests", set_as_current=False)
    app.conf.update(broker_url=redis_url, zsched_redis_url=settings.redis_url,
                    zsched_key_prefix=settings.key_prefix, zsched_metrics_port=port,
                    beat_schedule={})
    store = Store(rclient, settings)
    store.upsert_many([_job("a"), _job("b")], stagger=False)
    store.run_now("a", "b")
    due = {j: int(store.client.zscore(store.keys.schedule, j) or 0) for j in ("a", "b")}
    time.sleep(0.3)  # so the dispatch lag is measurably above zero
    scheduler = ZSchedScheduler(app=app)
    try:
        scheduler.tick()
        first = scrape(port)
        scheduler.tick()  # idle: a tick, but no publish sample
        second = scrape(port)
    finally:
        scheduler.close()

    assert value(first, "zsched_beat_ticks_total") == 1
    assert value(first, "zsched_beat_promoted_total") == 2
    assert value(first, "zsched_beat_claim_seconds_count") == 1
    assert value(first, "zsched_beat_publish_seconds_count") == 1
    assert value(first, "zsched_beat_dispatch_lag_seconds_count") == 2
    promoted = {j: store.get(j).state.promoted_ms for j in ("a", "b")}
    lag = sum(int(promoted[j] or 0) - due[j] for j in due) / 1000
    assert value(first, "zsched_beat_dispatch_lag_seconds_sum") == pytest.approx(lag, abs=0.01)
    assert lag >= 0.5  # two jobs, each due >= 0.3 s before the tick
    assert value(first, "zsched_beat_dispatch_lag_seconds_bucket", le="0.1") == 0
    assert abs(value(first, "zsched_beat_last_tick_timestamp_seconds") - time.time()) < 30

    assert value(second, "zsched_beat_ticks_total") == 2
    assert value(second, "zsched_beat_claim_seconds_count") == 2
    assert value(second, "zsched_beat_publish_seconds_count") == 1
    assert value(second, "zsched_beat_tick_failures_total") == 0
    # Beat's registry is its own: no process or platform collectors of the global one.
    assert not any(name.startswith(("process_", "python_")) for name, _ in second)


def test_beat_metrics_off_by_default_and_port_validated(
        make_settings: Callable[..., Settings]) -> None:
    metrics = BeatMetrics.for_settings(make_settings())
    assert not metrics.enabled
    metrics.tick([], 0)  # no-ops
    metrics.failure()
    with metrics.time_claim():
        pass
    with pytest.raises(Exception, match="metrics_port must be in 0-65535"):
        make_settings(metrics_port=70000).validate()
    env = {"ZSCHED_METRICS_PORT": "9999", "ZSCHED_METRICS_ADDR": "0.0.0.0"}
    settings = Settings.from_mapping({"zsched_redis_url": "redis://x:1/0"}, env)
    assert (settings.metrics_port, settings.metrics_addr) == (9999, "0.0.0.0")
    assert Settings().metrics_addr == "127.0.0.1"


def test_beat_counts_failed_ticks(make_settings: Callable[..., Settings]) -> None:
    port = free_port()
    app = Celery("metrics-down", set_as_current=False)
    app.conf.update(broker_url="memory://", zsched_redis_url=f"redis://127.0.0.1:{free_port()}/0",
                    zsched_metrics_port=port, beat_schedule={})
    scheduler = ZSchedScheduler(app=app)
    try:
        scheduler.tick()
        samples = scrape(port)
    finally:
        scheduler.close()
    assert value(samples, "zsched_beat_tick_failures_total") == 1
    assert value(samples, "zsched_beat_ticks_total") == 0


# ------------------------------------------------------------------- exporter
def test_exporter_reports_the_store_after_known_operations(
        make_store: Callable[..., Store], servers: Callable[..., int]) -> None:
    store = make_store(lease_s=0.2)
    store.upsert_many([_job(f"j{n}") for n in range(5)], stagger=False)
    store.pause("j4")
    store.run_now("j0", "j1", "j2")
    port = servers(store)
    time.sleep(0.05)
    before = scrape(port)  # positions the event cursor at the stream's end
    assert value(before, "zsched_up") == 1
    assert value(before, "zsched_start_lag_seconds_count") == 0

    claimed = {c.job.id: c for c in store.claim(2).jobs}
    assert len(claimed) == 2
    first, second = sorted(claimed.values(), key=lambda c: c.job.id)
    started = store.start(first.job.id, first.occurrence, first.attempt)
    assert started.runs
    store.settle(first.job.id, first.occurrence, first.attempt, "complete",
                 event={"due_ms": first.due_ms, "started_ms": first.due_ms + 1500})
    store.start(second.job.id, second.occurrence, second.attempt)
    store.settle(second.job.id, second.occurrence, second.attempt, "error", error="boom",
                 event={"due_ms": second.due_ms, "started_ms": second.due_ms + 7000})
    # One more claimed and started, then left to let its lease run out.
    (third,) = store.claim(1).jobs
    store.start(third.job.id, third.occurrence, third.attempt)
    time.sleep(0.3)

    after = scrape(port)
    assert value(after, "zsched_job_definitions") == 5
    assert value(after, "zsched_jobs", state="paused") == 1
    assert value(after, "zsched_jobs", state="running") == 1
    assert value(after, "zsched_jobs", state="queued") == 0
    assert value(after, "zsched_in_flight") == 1
    assert value(after, "zsched_leases_expired") == 1
    assert value(after, "zsched_settles_total", outcome="complete") == 1
    assert value(after, "zsched_settles_total", outcome="retrying") == 1
    assert value(after, "zsched_settles_total", outcome="error") == 0
    assert value(after, "zsched_promoted_total") == 3
    assert value(after, "zsched_started_total") == 3
    assert value(after, "zsched_start_lag_seconds_count") == 2
    assert value(after, "zsched_start_lag_seconds_sum") == pytest.approx(8.5)
    assert value(after, "zsched_start_lag_seconds_bucket", le="2.0") == 1
    assert value(after, "zsched_start_lag_seconds_bucket", le="10.0") == 2
    # Five jobs, due from the start: one paused, three claimed, one due since.
    # (The retry of the errored one is due later.)
    assert value(after, "zsched_due_backlog") == 1
    assert 0.3 <= value(after, "zsched_due_oldest_age_seconds") < 5

    # Reaped: the expired lease is redelivered (due again now, so a backlog).
    assert store.reap().redelivered == 1
    time.sleep(0.05)
    reaped = scrape(port)
    assert value(reaped, "zsched_redeliveries_total") == 1
    assert value(reaped, "zsched_leases_expired") == 0
    assert value(reaped, "zsched_due_backlog") == 2
    # Read once: a scrape never counts an event again.
    assert value(scrape(port), "zsched_start_lag_seconds_count") == 2


def test_exporter_dead_letters(make_store: Callable[..., Store],
                               servers: Callable[..., int]) -> None:
    store = make_store(lease_s=0.1, max_deliveries=1)
    store.upsert(_job("doomed"))
    store.run_now("doomed")
    (claimed,) = store.claim().jobs
    store.start(claimed.job.id, claimed.occurrence, claimed.attempt)
    time.sleep(0.2)
    assert store.reap().dead == 1
    samples = scrape(servers(store))
    assert value(samples, "zsched_dead_letters") == 1
    assert value(samples, "zsched_jobs", state="dead") == 1
    assert value(samples, "zsched_dead_lettered_total") == 1


def test_exporter_domain_series_stay_bounded(make_store: Callable[..., Store],
                                             servers: Callable[..., int]) -> None:
    store = make_store(pacing=True, domain_delay_s=0, domain_max_in_flight=0)
    for n in range(6):  # six domains slowed down by a 429 each
        settle_all(store, f"slow{n}.example", 1, "error", 429, retry_after_s=60 + n)
    settle_all(store, "fine.example", 2, "complete", 200)
    samples = scrape(servers(store, top_domains=3))
    assert value(samples, "zsched_domains") == 7
    assert value(samples, "zsched_domains_throttled") == 6
    assert value(samples, "zsched_domains_breaker_open") == 0
    per_domain = {dict(labels)["domain"] for name, labels in samples
                  if name == "zsched_domain_delay_seconds"}
    assert len(per_domain) == 3 and "fine.example" not in per_domain
    # No label anywhere names a job: the label sets are fixed or top-K bounded.
    labels = {key for _name, pairs in samples for key, _ in pairs}
    assert labels <= {"state", "outcome", "domain", "le"}


def test_exporter_survives_redis_down(make_settings: Callable[..., Settings],
                                      servers: Callable[..., int],
                                      caplog: pytest.LogCaptureFixture) -> None:
    down = Store.from_settings(make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    port = servers(down)
    for _ in range(2):  # the server keeps serving
        samples = scrape(port)
        assert value(samples, "zsched_up") == 0
        assert not any(name == "zsched_jobs" for name, _ in samples)
    assert "zsched exporter: cannot read" in caplog.text


def test_exporter_command_serves_the_store(redis_url: str, make_store: Callable[..., Store]
                                           ) -> None:
    store = make_store()
    store.upsert_many([_job("x"), _job("y")], stagger=False)
    port = free_port()
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url,
           "ZSCHED_KEY_PREFIX": store.settings.key_prefix, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([str(CELERY), "-A", "tests.cli_app", "zsched", "exporter",
                             "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def up() -> Samples | None:
            try:
                return scrape(port)
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return None
        samples = wait(up, 20, "the exporter to serve")
        assert value(samples, "zsched_up") == 1
        assert value(samples, "zsched_job_definitions") == 2
    finally:
        proc.terminate()
        proc.wait(10)


# ----------------------------------------------------------------------- docs
def exported_names(store: Store) -> set[str]:
    """Every metric and sample name beat and the exporter can export."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    families = [*BeatMetrics(enabled=True).registry.collect(), *registry.collect()]
    names = set()
    for family in families:
        names |= {family.name, *(s.name for s in family.samples)}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
    return names


def _used_names(text: str) -> set[str]:
    return set(re.findall(r"\bzsched_[a-z0-9_]+", text))


def test_dashboard_and_alerts_use_exported_names(make_store: Callable[..., Store]) -> None:
    exported = exported_names(make_store(pacing=True))
    dashboard_text = (ROOT / "docs" / "grafana-dashboard.json").read_text()
    dashboard = json.loads(dashboard_text)
    assert dashboard["panels"] and dashboard["title"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    alerts_text = (ROOT / "docs" / "alerts.yml").read_text()
    try:
        import yaml
    except ImportError:  # PyYAML is optional: check the shape by hand
        assert alerts_text.startswith("groups:") and "expr:" in alerts_text
        alert_names = set(re.findall(r"- alert: (\w+)", alerts_text))
    else:
        rules = [r for g in yaml.safe_load(alerts_text)["groups"] for r in g["rules"]]
        alert_names = {r["alert"] for r in rules}
        assert all(r["expr"] for r in rules)
    assert len(alert_names) >= 4
    used = _used_names(" ".join(exprs)) | _used_names(alerts_text)
    # Setting names (zsched_metrics_port ...) may appear in descriptions; not metrics.
    used -= {"zsched_metrics_port", "zsched_metrics_addr"}
    assert used and used <= exported, used - exported
    for needed in ("zsched_due_backlog", "zsched_beat_dispatch_lag_seconds_bucket",
                   "zsched_dead_letters", "zsched_beat_last_tick_timestamp_seconds"):
        assert needed in _used_names(alerts_text)
