"""The tracing integration's spans, read with the SDK's in-memory exporter.

The end-to-end proof (real beat, prefork worker and ``zsched serve``) is
``tests/e2e/test_tracing.py``; here each piece is pinned on its own: the spans
and headers of a publish, the settle event, the gateway's hand-out spans, and
the extension that installs it all only when ``zsched_tracing`` is on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.job import Job
from celery_zsched.core.results import Claimed, SettleResult
from celery_zsched.services import tracing
from celery_zsched.tracing import EXTENSION
from celery_zsched.tracing import spans as spans_module
from celery_zsched.tracing.spans import Tracer

APPLIED = SettleResult(True, "ok", "complete", next_due_ms=9_000)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def tracer(provider: TracerProvider) -> Tracer:
    return Tracer(provider)


@pytest.fixture
def clean_process() -> Iterator[None]:
    """The extension changes process-wide state: put it back."""
    yield
    tracing.install(None)
    instrumentor = CeleryInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def claimed(job_id: str, occurrence: int = 1_000, attempt: int = 1, fence: int = 0) -> Claimed:
    job = Job.from_dict({"id": job_id, "url": f"https://example.com/{job_id}",
                         "interval_s": 60})
    return Claimed(job, occurrence, attempt, 2, occurrence, occurrence + 250, fence)


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-"


def test_each_published_message_gets_a_root_span_and_its_traceparent(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    jobs = [claimed("a"), claimed("b", occurrence=2_000, attempt=3)]
    batch = tracer.publishing(jobs)
    assert exporter.get_finished_spans() == ()  # open while the batch is published
    batch.end()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["zsched publish"] * 2
    assert len({s.context.trace_id for s in spans if s.context}) == 2  # a trace each
    for span, job, headers in zip(spans, jobs, batch.headers, strict=True):
        assert span.parent is None and span.kind is trace.SpanKind.PRODUCER
        assert headers["traceparent"].startswith(traceparent_of(span))
        assert dict(span.attributes or {}) == {
            "zsched.job_id": job.job.id, "zsched.occurrence": job.occurrence,
            "zsched.attempt": job.attempt, "zsched.delivery": 2, "zsched.lateness_ms": 250}


def test_a_failed_publish_ends_its_spans_as_errors(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    tracer.publishing([claimed("a")]).end(ConnectionError("broker down"))
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_the_settle_is_an_event_on_the_running_tasks_span(
        tracer: Tracer, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    with provider.get_tracer("test").start_as_current_span("run/task"):
        tracer.settled(None, "a", 1_000, 1, "complete", APPLIED, 4)
    [task] = exporter.get_finished_spans()
    [event] = task.events
    assert event.name == "zsched.settle"
    assert dict(event.attributes or {}) == {
        "zsched.outcome": "complete", "zsched.applied": True, "zsched.status": "complete",
        "zsched.fence": 4, "zsched.next_due_ms": 9_000}


def test_a_settle_outside_a_task_continues_the_messages_trace(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    batch = tracer.publishing([claimed("a")])
    batch.end()

    class Request:  # Celery's request: each message header is an attribute
        traceparent = batch.headers[0]["traceparent"]

    tracer.settled(Request(), "a", 1_000, 1, "error", SettleResult(False, "stale", "stale"),
                   None)
    publish, settle = exporter.get_finished_spans()
    assert settle.name == "zsched settle" and settle.parent is not None
    assert settle.parent.span_id == publish.context.span_id  # type: ignore[union-attr]
    assert [dict(e.attributes or {}) for e in settle.events] == [
        {"zsched.outcome": "error", "zsched.applied": False, "zsched.status": "stale"}]


def test_a_settle_with_no_trace_to_continue_records_nothing(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    tracer.settled(None, "a", 1_000, 1, "complete", APPLIED, 1)
    assert exporter.get_finished_spans() == ()


def test_a_hand_out_span_lasts_until_its_report_and_holds_the_settle(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    parent = tracer.handed_out(claimed("a", fence=7))
    assert parent is not None and exporter.get_finished_spans() == ()
    tracer.reported("a", 1_000, 1, 7, "complete", APPLIED, {})
    [span] = exporter.get_finished_spans()
    assert span.name == "zsched hand-out" and span.parent is None
    assert parent.startswith(traceparent_of(span))
    assert [(e.name, dict(e.attributes or {})["zsched.fence"]) for e in span.events] == [
        ("zsched.settle", 7)]


def test_a_report_another_server_handed_out_continues_the_reports_traceparent(
        tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    elsewhere = Tracer(TracerProvider())  # another server process: spans not seen here
    parent = elsewhere.handed_out(claimed("a", fence=3))
    assert parent is not None
    tracer.reported("a", 1_000, 1, 3, "complete", APPLIED, {"traceparent": parent})
    [settle] = exporter.get_finished_spans()
    assert settle.name == "zsched settle" and settle.parent is not None
    assert parent.startswith(f"00-{settle.parent.trace_id:032x}-{settle.parent.span_id:016x}-")


def test_open_hand_outs_are_bounded_and_ended_on_close(
        tracer: Tracer, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spans_module, "MAX_OPEN_HAND_OUTS", 2)
    for fence in (1, 2, 3):
        tracer.handed_out(claimed("a", fence=fence))
    [oldest] = exporter.get_finished_spans()
    assert (oldest.attributes or {})["zsched.settled"] is False
    tracer.close()
    assert len(exporter.get_finished_spans()) == 3
    tracer.reported("a", 1_000, 1, 3, "complete", APPLIED, {})  # ended: a span of its own
    assert exporter.get_finished_spans()[-1].name == "zsched settle"


def test_the_traceparent_is_w3c_trace_context(tracer: Tracer) -> None:
    batch = tracer.publishing([claimed("a")])
    context = trace.get_current_span(
        TraceContextTextMapPropagator().extract(batch.headers[0])).get_span_context()
    batch.end()
    assert context.is_valid and context.is_remote


def test_with_tracing_off_the_extension_installs_nothing(clean_process: None) -> None:
    EXTENSION.start(Celery(set_as_current=False), "worker")
    assert tracing.active() is None
    assert not CeleryInstrumentor().is_instrumented_by_opentelemetry


def test_with_tracing_on_a_worker_installs_the_tracer_and_instruments_celery(
        clean_process: None) -> None:
    app = Celery(set_as_current=False)
    app.conf.zsched_tracing = True
    EXTENSION.start(app, "beat")
    assert isinstance(tracing.active(), Tracer)
    assert not CeleryInstrumentor().is_instrumented_by_opentelemetry  # beat: never
    EXTENSION.start(app, "worker")
    assert CeleryInstrumentor().is_instrumented_by_opentelemetry


def test_tracing_without_opentelemetry_is_a_configuration_error(
        clean_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "celery_zsched.tracing.spans", None)
    app = Celery(set_as_current=False)
    app.conf.zsched_tracing = True
    with pytest.raises(ConfigurationError, match=r"zsched_tracing.*celery-zsched\[otel\]"):
        EXTENSION.start(app, "beat")
