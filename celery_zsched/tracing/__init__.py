"""OpenTelemetry tracing as an extension: a trace per occurrence (``zsched_tracing``).

Loaded through the ``celery_zsched.extensions`` entry points like the notifiers
and the metrics, and imports nothing of OpenTelemetry until a process starts
with ``zsched_tracing`` on: then it installs its tracer
(:mod:`celery_zsched.tracing.spans`) behind :mod:`celery_zsched.services.tracing`,
where beat, the workers and the job gateway find it. A worker's main process
also instruments Celery (``opentelemetry-instrumentation-celery``), before its
pool forks, so that each task's span continues the trace of beat's message.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_zsched.config import SETTING_PREFIX, Settings
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.services import tracing

logger = logging.getLogger("celery_zsched")
#: The package the ``otel`` extra installs, named in the error when it is missing.
_EXTRA = "pip install 'celery-zsched[otel]'"


class _Extension:
    """Installs the tracer where beat, a worker or ``zsched serve`` starts with tracing on."""

    def start(self, app: Any, role: str) -> None:
        if not Settings.from_app(app).tracing:
            return
        try:
            from celery_zsched.tracing.spans import Tracer
        except ImportError as exc:
            raise ConfigurationError(
                f"{SETTING_PREFIX}tracing needs OpenTelemetry ({exc}): {_EXTRA}") from exc
        if tracing.active() is None:
            tracing.install(Tracer())
        if role == "worker":
            _instrument_celery()

    def stop(self, role: str) -> None:
        tracer = tracing.active()
        if tracer is not None and role != "worker_process":
            tracer.close()


def _instrument_celery() -> None:
    """Instrument Celery once (a project that did so itself is left as it is)."""
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
    except ImportError as exc:
        raise ConfigurationError(
            f"{SETTING_PREFIX}tracing needs opentelemetry-instrumentation-celery in the "
            f"workers ({exc}): {_EXTRA}") from exc
    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()


#: Registered under the ``celery_zsched.extensions`` entry point group.
EXTENSION = _Extension()
