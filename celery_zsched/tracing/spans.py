"""The spans of an occurrence, with OpenTelemetry's API (the ``otel`` extra).

One trace per occurrence: beat's ``zsched publish`` span is its root, and its
context travels in the message's headers as W3C ``traceparent`` (through the
global propagator, so a project's own propagators apply). The task's span of
``opentelemetry-instrumentation-celery`` continues it, and the settle is an
event on that span. For an HTTP job the gateway's ``zsched hand-out`` span is
the root: its ``traceparent`` is in the job's body, and the span stays open
until the job is reported, so the settle is an event on it too.

Spans go to the tracer provider the project configures (``opentelemetry-sdk``
and an exporter of its choice): this package never configures one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from celery_zsched.core.results import Claimed, SettleResult

#: Instrumentation scope of every span here.
SCOPE = "celery_zsched"
PUBLISH = "zsched publish"
HAND_OUT = "zsched hand-out"
SETTLE = "zsched settle"
SETTLE_EVENT = "zsched.settle"
#: Hand-outs whose span waits for a report, at most (the oldest is ended first,
#: unsettled): a worker that never reports must not grow the server's memory.
MAX_OPEN_HAND_OUTS = 10_000

_Key = tuple[str, int, int, int]


def occurrence_attributes(claimed: Claimed) -> dict[str, Any]:
    """What a publish or hand-out span says about its occurrence.

    The task's name and id are left to the task's own span (the instrumentation
    sets them): each attribute costs every message of a storm.
    """
    return {
        "zsched.job_id": claimed.job.id,
        "zsched.occurrence": claimed.occurrence,
        "zsched.attempt": claimed.attempt,
        "zsched.delivery": claimed.deliveries,
        # Both on Redis' clock: the claim's reading minus the due time.
        "zsched.lateness_ms": claimed.promoted_ms - claimed.due_ms,
    }


def settle_attributes(outcome: str, result: SettleResult, fence: int | None) -> dict[str, Any]:
    """What the settle event says: the outcome reported, what the compare-and-set did."""
    attributes: dict[str, Any] = {
        "zsched.outcome": outcome,
        "zsched.applied": result.applied,
        "zsched.status": result.label,
    }
    if fence is not None:
        attributes["zsched.fence"] = fence
    if result.next_due_ms is not None:
        attributes["zsched.next_due_ms"] = result.next_due_ms
    return attributes


class _CarrierGetter(Getter[Any]):
    """Reads a propagator's fields from a mapping, or from a Celery request's attributes."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key) if isinstance(carrier, Mapping) else getattr(carrier, key, None)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier) if isinstance(carrier, Mapping) else []


_GETTER = _CarrierGetter()


class PublishedBatch:
    """The ``zsched publish`` spans of one batch, and the headers that carry them."""

    __slots__ = ("headers", "spans")

    def __init__(self, spans: list[Span], headers: list[dict[str, str]]) -> None:
        self.spans = spans
        self.headers = headers

    def end(self, error: BaseException | None = None) -> None:
        for span in self.spans:
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()


class Tracer:
    """:class:`~celery_zsched.services.tracing.OccurrenceTracer` on OpenTelemetry's API."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        self._open: OrderedDict[_Key, Span] = OrderedDict()
        self._lock = threading.Lock()

    def publishing(self, jobs: Sequence[Claimed]) -> PublishedBatch:
        start = self._tracer.start_span
        spans: list[Span] = []
        headers: list[dict[str, str]] = []
        for claimed in jobs:
            # A root: an occurrence's trace starts with its publish. Its attributes are
            # built only for a span the sampler records (a storm's largest saving).
            span = start(PUBLISH, context=_ROOT, kind=SpanKind.PRODUCER)
            if span.is_recording():
                span.set_attributes(occurrence_attributes(claimed))
            carrier: dict[str, str] = {}
            inject(carrier, context=trace.set_span_in_context(span, _ROOT))
            spans.append(span)
            headers.append(carrier)
        return PublishedBatch(spans, headers)

    def settled(self, carrier: Any, job_id: str, occurrence: int, attempt: int, outcome: str,
                result: SettleResult, fence: int | None) -> None:
        attributes = settle_attributes(outcome, result, fence)
        current = trace.get_current_span()
        if current.is_recording():  # the task's span (opentelemetry-instrumentation-celery)
            current.add_event(SETTLE_EVENT, attributes)
            return
        if carrier is None:
            return
        self._settle_span(extract(carrier, getter=_GETTER), job_id, occurrence, attempt,
                          attributes)

    def handed_out(self, claimed: Claimed) -> str | None:
        span = self._tracer.start_span(HAND_OUT, context=_ROOT, kind=SpanKind.PRODUCER,
                                       attributes=occurrence_attributes(claimed))
        carrier: dict[str, str] = {}
        inject(carrier, context=trace.set_span_in_context(span, _ROOT))
        key = (claimed.job.id, claimed.occurrence, claimed.attempt, claimed.fence)
        with self._lock:
            self._open[key] = span
            overflow = [self._open.popitem(last=False)[1]
                        for _ in range(len(self._open) - MAX_OPEN_HAND_OUTS)]
        _end_unsettled(overflow)
        return carrier.get("traceparent")

    def reported(self, job_id: str, occurrence: int, attempt: int, fence: int, outcome: str,
                 result: SettleResult, headers: Mapping[str, str]) -> None:
        attributes = settle_attributes(outcome, result, fence)
        with self._lock:
            span = self._open.pop((job_id, occurrence, attempt, fence), None)
        if span is not None:
            span.add_event(SETTLE_EVENT, attributes)
            span.end()
            return
        # Handed out by another server process (or before a restart): the report's
        # own traceparent, when the worker sends one, keeps the settle in the trace.
        self._settle_span(extract(headers, getter=_GETTER), job_id, occurrence, attempt,
                          attributes)

    def close(self) -> None:
        with self._lock:
            spans = list(self._open.values())
            self._open.clear()
        _end_unsettled(spans)

    def _settle_span(self, context: Context, job_id: str, occurrence: int, attempt: int,
                     attributes: dict[str, Any]) -> None:
        span = self._tracer.start_span(SETTLE, context=context, attributes={
            "zsched.job_id": job_id, "zsched.occurrence": occurrence, "zsched.attempt": attempt})
        span.add_event(SETTLE_EVENT, attributes)
        span.end()


_ROOT = Context()


def _end_unsettled(spans: Iterable[Span]) -> None:
    for span in spans:
        span.set_attribute("zsched.settled", False)
        span.end()
