"""OpenTelemetry tracing: a trace per occurrence (the ``otel`` extra)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TracingSettings:
    """Whether beat, the workers and ``zsched serve`` trace each occurrence."""

    #: Trace each occurrence with OpenTelemetry (needs ``pip install
    #: 'celery-zsched[otel]'`` and a tracer provider of your own): beat opens a
    #: span per published message and puts its W3C ``traceparent`` in the
    #: message's headers, the workers instrument Celery so that the task's span is
    #: its child and record the settle on it, and the job gateway does the same
    #: for HTTP jobs (see "Trace each occurrence" in the how-to guides).
    tracing: bool = False
