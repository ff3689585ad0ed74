"""Prometheus metrics: where beat serves them."""

from __future__ import annotations

from dataclasses import dataclass

from celery_zsched.config.load import SETTING_PREFIX
from celery_zsched.core.errors import ConfigurationError


@dataclass(frozen=True)
class MetricsSettings:
    """Beat's metrics server (the exporter takes its address on the command line)."""

    #: Port of beat's Prometheus ``/metrics`` (see the README's "Operating it:
    #: metrics"); 0: no metrics server.
    metrics_port: int = 0
    #: Address beat's metrics server binds. Loopback by default: metrics say how
    #: big the fleet is and how it fares, so exposing them is a deliberate choice.
    metrics_addr: str = "127.0.0.1"

    def _check_metrics(self) -> None:
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(
                f"{SETTING_PREFIX}metrics_port must be in 0-65535 (0: off), "
                f"got {self.metrics_port!r}")
