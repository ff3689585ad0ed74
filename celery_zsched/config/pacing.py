"""Per-domain pacing: delays, caps, adaptation and the circuit breaker."""

from __future__ import annotations

from dataclasses import dataclass

from celery_zsched.config.load import SETTING_PREFIX, check_not_negative, check_positive
from celery_zsched.core.domains import PacingDefaults
from celery_zsched.core.errors import ConfigurationError


@dataclass(frozen=True)
class PacingSettings:
    """How fast each domain may be fetched, and when it is left alone."""

    #: Pace requests per domain in the claim (see the README's "Politeness").
    pacing: bool = False
    #: Least delay between the starts of two requests to one domain.
    domain_delay_s: float = 1.0
    #: Worker starts of two requests to one domain are at least the delay plus
    #: this apart: it absorbs the worker's own path from its start to the socket.
    domain_start_margin_s: float = 0.05
    #: Most requests to one domain in flight (claimed and not settled); 0: no cap.
    domain_max_in_flight: int = 1
    #: Group hosts by registrable domain (eTLD+1, Public Suffix List).
    domain_registrable: bool = False
    #: Cap of a domain's adaptive delay.
    domain_max_delay_s: float = 300.0
    #: A 429 without Retry-After multiplies the domain's delay by this.
    domain_backoff: float = 2.0
    #: Each success takes this off a raised delay, never going below the base.
    domain_decrease_s: float = 0.5
    #: The breaker opens when this share of a domain's recent requests failed...
    breaker_ratio: float = 0.5
    #: ... over a window this long ...
    breaker_window_s: float = 60.0
    #: ... with at least this many requests in it ...
    breaker_min_requests: int = 10
    #: ... and stays open this long before one probe goes out.
    breaker_cooldown_s: float = 30.0

    @property
    def pacing_defaults(self) -> PacingDefaults:
        """The pacing settings as the Lua scripts read them (ms)."""
        return PacingDefaults(
            delay_ms=round(self.domain_delay_s * 1000), cap=self.domain_max_in_flight,
            max_delay_ms=round(self.domain_max_delay_s * 1000), backoff=self.domain_backoff,
            decrease_ms=round(self.domain_decrease_s * 1000), breaker_ratio=self.breaker_ratio,
            breaker_window_ms=round(self.breaker_window_s * 1000),
            breaker_min=self.breaker_min_requests,
            breaker_cooldown_ms=round(self.breaker_cooldown_s * 1000),
            start_margin_ms=round(self.domain_start_margin_s * 1000),
            # RobotsSettings' switch, when this section is part of Settings.
            robots=bool(getattr(self, "robots", False)),
            delay_configured=self.domain_delay_s != PacingSettings.domain_delay_s)

    def _check_pacing(self) -> None:
        check_not_negative(self, "domain_delay_s", "domain_max_in_flight", "domain_decrease_s",
                           "domain_start_margin_s", "breaker_min_requests")
        check_positive(self, "domain_max_delay_s", "breaker_window_s", "breaker_cooldown_s")
        if self.domain_backoff < 1:
            raise ConfigurationError(
                f"{SETTING_PREFIX}domain_backoff must be >= 1, got {self.domain_backoff!r}")
        if not 0 < self.breaker_ratio <= 1:
            raise ConfigurationError(
                f"{SETTING_PREFIX}breaker_ratio must be in (0, 1], got {self.breaker_ratio!r}")
