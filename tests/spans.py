"""Spans of real processes, for the tracing tests: written as JSON lines, read back.

:func:`export_to` is called in the beat, worker and server processes (the e2e app
does when ``E2E_SPANS_FILE`` is set): it installs a tracer provider whose span
processor writes each ended span to the file at once, one ``write`` per line on
a descriptor opened for appending, so the prefork pool's processes never mix
their lines. :func:`read_spans` is the tests' side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends each span to ``path`` as one JSON line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a span."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name,
        "pid": os.getpid(),
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                   for e in span.events],
    }


def export_to(path: str) -> None:
    """Send this process's spans to ``path`` (the global tracer provider)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


@dataclass(frozen=True)
class SpanRecord:
    """One span read back from the file."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    pid: int
    attributes: dict[str, Any]
    events: list[dict[str, Any]]


def read_spans(path: Path) -> list[SpanRecord]:
    """Every span written to ``path`` so far."""
    if not path.exists():
        return []
    return [SpanRecord(**json.loads(line)) for line in path.read_text().splitlines() if line]
