"""The named interface between the front ends and the tracing integration.

Beat, the workers and the job gateway never import OpenTelemetry: they ask
:func:`active` for the tracer that the ``tracing`` extension installed when
its process started with ``zsched_tracing`` on (:mod:`celery_zsched.tracing`),
and do nothing more when there is none. So with tracing off, a publish costs
one ``None`` test per batch and its messages are byte for byte the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from celery_zsched.core.results import Claimed, SettleResult


class PublishSpans(Protocol):
    """The spans of one published batch, one per message."""

    @property
    def headers(self) -> Sequence[Mapping[str, str]]:
        """The headers each message carries besides its own (``traceparent``), in the
        batch's order."""

    def end(self, error: BaseException | None = None) -> None:
        """The batch was published (or failed with ``error``): end every span."""


class OccurrenceTracer(Protocol):
    """What the front ends tell the tracing integration."""

    def publishing(self, jobs: Sequence[Claimed]) -> PublishSpans:
        """Beat is about to publish ``jobs``: a span for each, and the headers it sends."""

    def settled(self, carrier: Any, job_id: str, occurrence: int, attempt: int, outcome: str,
                result: SettleResult, fence: int | None) -> None:
        """A worker settled an occurrence: an event on the task's span (current while a
        task runs), else on a short span continuing ``carrier``'s trace (the request or
        message headers of a task that never ran)."""

    def handed_out(self, claimed: Claimed) -> str | None:
        """The gateway hands ``claimed`` out: its span, and the ``traceparent`` the job's
        body carries (``None``: not traced)."""

    def reported(self, job_id: str, occurrence: int, attempt: int, fence: int, outcome: str,
                 result: SettleResult, headers: Mapping[str, str]) -> None:
        """An HTTP worker settled a hand-out: an event on the hand-out's span, or on a
        span continuing the report's own ``traceparent`` (``headers``)."""

    def close(self) -> None:
        """The process stops: end what is still open."""


_active: OccurrenceTracer | None = None


def active() -> OccurrenceTracer | None:
    """The tracer of this process, or ``None`` (tracing off: the default)."""
    return _active


def install(tracer: OccurrenceTracer | None) -> None:
    """Make ``tracer`` this process's tracer (``None``: none); pool processes inherit it."""
    global _active
    _active = tracer
