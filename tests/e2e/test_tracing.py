"""A trace per occurrence, across a real beat and a real prefork worker (``zsched_tracing``).

Each process appends its spans to one file (``tests/spans.py``): beat's publish
spans, and the task spans that ``opentelemetry-instrumentation-celery`` opens in
the worker's pool processes. Every settled occurrence must be exactly one trace:
beat's span at its root, the task's span its child, the settle an event on it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from e2e.conftest import Deployment, TargetServer
from e2e.names import ENV_SPANS_FILE, SCRAPE_TASK
from tests.gateway.conftest import LEASE_SECRET, TOKENS, WORKER
from tests.helpers import answers, free_port, wait
from tests.spans import SpanRecord, read_spans

pytestmark = pytest.mark.slow

JOBS = 3
RUNS = 2


def _traces(spans: list[SpanRecord]) -> dict[str, list[SpanRecord]]:
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    return by_trace


def test_each_occurrence_is_one_trace_from_beat_to_a_prefork_worker(
        deploy: Callable[..., Deployment], target: TargetServer, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = {ENV_SPANS_FILE: str(spans_file)}
    d = deploy(tracing=True)
    jobs = [d.job(url=target.url(f"/ok/traced{i}"), interval_s=1) for i in range(JOBS)]
    for job in jobs:
        d.store.upsert(job)
    beat = d.start_beat(env=env)
    worker = d.start_worker(pool="prefork", concurrency=2, env=env)
    for job in jobs:
        d.wait_info(job.id, lambda i: i.state.runs >= RUNS, 60, f"{job.id} to run {RUNS} times")
    beat.stop()
    # What beat published before it stopped settles; then nothing is in flight.
    for job in jobs:
        d.wait_info(job.id, lambda i: i.status == "scheduled", 30, f"{job.id} to settle")
    worker.stop()

    settles = {(f["id"], int(f["occ"])) for _id, f in d.store.events()}
    spans = read_spans(spans_file)
    publishes = [s for s in spans if s.name == "zsched publish"]
    assert len(settles) >= JOBS * RUNS
    # One publish span per occurrence, each the root of a trace of its own.
    assert sorted((p.attributes["zsched.job_id"], p.attributes["zsched.occurrence"])
                  for p in publishes) == sorted(settles)
    assert len({p.trace_id for p in publishes}) == len(publishes)
    traces = _traces(spans)
    assert set(traces) == {p.trace_id for p in publishes}, "a span outside every occurrence"
    for publish in publishes:
        assert publish.parent_id is None and publish.kind == "PRODUCER"
        assert publish.pid == beat.pid
        assert publish.attributes["zsched.attempt"] == 1
        assert publish.attributes["zsched.delivery"] == 1
        assert publish.attributes["zsched.lateness_ms"] >= 0
        others = [s for s in traces[publish.trace_id] if s is not publish]
        assert len(others) == 1, others
        task = others[0]
        # The instrumentation's task span, in a pool process, continues beat's span.
        assert task.name == f"run/{SCRAPE_TASK}" and task.kind == "CONSUMER"
        assert task.parent_id == publish.span_id
        assert task.pid not in (beat.pid, worker.pid)
        assert task.attributes["celery.task_name"] == SCRAPE_TASK
        [settle] = [e for e in task.events if e["name"] == "zsched.settle"]
        assert settle["attributes"]["zsched.outcome"] == "complete"
        assert settle["attributes"]["zsched.applied"] is True
        assert settle["attributes"]["zsched.status"] == "complete"
        assert settle["attributes"]["zsched.fence"] >= 1
    assert len({s.pid for s in spans if s.name != "zsched publish"}) >= 1


def test_each_http_job_is_one_trace_from_the_gateway_to_its_worker_and_report(
        deploy: Callable[..., Deployment], target: TargetServer, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    d = deploy(tracing=True, api_tokens=TOKENS, gateway_lease_secret=LEASE_SECRET)
    jobs = [d.job(url=target.url(f"/ok/http{i}"), interval_s=3600, transport="http")
            for i in range(JOBS)]
    d.store.upsert_many(jobs, stagger=False)
    port = free_port()
    server = d._spawn("gateway", ["zsched", "serve", "--port", str(port),
                                  "--log-level", "warning"], {ENV_SPANS_FILE: str(spans_file)})
    # The HTTP worker: this process, with the SDK's in-memory exporter. It continues
    # each job's trace from the body's traceparent and sends its own span's with the report.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("http-worker")
    propagator = TraceContextTextMapPropagator()
    auth = {"Authorization": f"Bearer {WORKER}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=10) as client:
        wait(lambda: answers(port), 120, "zsched serve to answer")
        bodies = []
        while len(bodies) < JOBS:
            answer = client.get("/jobs/next", params={"timeout": 5})
            d.check_alive()
            if answer.status_code == 204:
                continue
            body = answer.json()
            bodies.append(body)
            parent = propagator.extract({"traceparent": body["traceparent"]})
            with tracer.start_as_current_span("fetch", context=parent):
                httpx.get(body["url"], timeout=10).raise_for_status()
                report_headers: dict[str, str] = {}
                propagator.inject(report_headers)
                reply = client.post(f"/jobs/{body['id']}/complete",
                                    json={"lease": body["lease"]}, headers=report_headers)
            assert reply.status_code == 200, reply.text
    server.stop()

    hand_outs = [s for s in read_spans(spans_file) if s.name == "zsched hand-out"]
    fetches = {f"{s.context.trace_id:032x}": s for s in exporter.get_finished_spans()}
    assert sorted(h.attributes["zsched.job_id"] for h in hand_outs) == sorted(j.id for j in jobs)
    assert len({h.trace_id for h in hand_outs}) == JOBS
    for body, hand_out in zip(bodies, sorted(hand_outs, key=lambda h: [
            b["id"] for b in bodies].index(h.attributes["zsched.job_id"])), strict=True):
        assert hand_out.parent_id is None and hand_out.pid == server.pid
        assert hand_out.attributes["zsched.occurrence"] == body["occurrence"]
        assert body["traceparent"].startswith(f"00-{hand_out.trace_id}-{hand_out.span_id}-")
        fetch = fetches[hand_out.trace_id]
        assert fetch.parent is not None and f"{fetch.parent.span_id:016x}" == hand_out.span_id
        [settle] = [e for e in hand_out.events if e["name"] == "zsched.settle"]
        assert settle["attributes"]["zsched.outcome"] == "complete"
        assert settle["attributes"]["zsched.applied"] is True
        assert settle["attributes"]["zsched.fence"] >= 1
    # No settle span of its own: each report found its hand-out's span open.
    assert [s for s in read_spans(spans_file) if s.name == "zsched settle"] == []

