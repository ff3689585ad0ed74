"""What a job reads of the settings: the defaults and policies it falls back to.

A protocol, so the core never imports the settings (the layer above it):
:class:`celery_zsched.config.Settings` is one, and so is any object with these
attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class JobPolicy(Protocol):
    """The settings a :class:`~celery_zsched.core.job.Job` falls back to or obeys."""

    @property
    def default_task(self) -> str: ...
    @property
    def default_interval_s(self) -> float: ...
    @property
    def max_jitter_s(self) -> float: ...
    @property
    def retry_max(self) -> int: ...
    @property
    def retry_base_s(self) -> float: ...
    @property
    def retry_cap_s(self) -> float: ...
    @property
    def misfire_grace_s(self) -> float: ...
    @property
    def pacing(self) -> bool: ...
    @property
    def domain_registrable(self) -> bool: ...


@dataclass(frozen=True)
class Defaults:
    """What a definition inherits when it leaves a field out."""

    task: str = "scrape"
    interval_s: float = 300.0
    timezone: str = "UTC"

    @classmethod
    def from_settings(cls, settings: JobPolicy, timezone: str | None = None) -> Defaults:
        """Defaults from settings and the Celery app's time zone."""
        return cls(settings.default_task, settings.default_interval_s, timezone or "UTC")
