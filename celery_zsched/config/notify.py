"""The built-in notifiers: which signals, where to, and how often."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from celery_zsched.config.load import SETTING_PREFIX, check_not_negative, check_positive
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.core.events import SIGNAL_NAMES


@dataclass(frozen=True)
class NotifySettings:
    """The webhook and mail notifiers, their rate limit and digest."""

    #: Signals the built-in notifiers report (comma-separated names; see the
    #: README's "Operating it: notifications").
    notify_events: str = ("job_retries_exhausted,job_dead_lettered,job_failing_streak,"
                          "domain_breaker_opened")
    #: ``job_failing_streak`` fires when a job's errors in a row reach this; 0: never.
    notify_streak: int = 5
    #: POST each notice as signed JSON to this URL; empty: no webhook.
    notify_webhook_url: str = ""
    #: Key of the HMAC-SHA256 signature header; empty: unsigned.
    notify_webhook_secret: str = ""
    #: Seconds one webhook request may take.
    notify_webhook_timeout_s: float = 5.0
    #: Webhook retries after a failed request (5xx, 408, 429, network), with backoff.
    notify_webhook_retries: int = 3
    #: Mail each notice to Django's ADMINS (``mail_admins``; needs the Django app).
    notify_mail: bool = False
    #: At most one notice per job (or domain) and signal in this many seconds.
    notify_window_s: float = 3600.0
    #: More notices than this in one digest window are held for one digest.
    notify_digest_threshold: int = 20
    #: Length of a digest window, seconds.
    notify_digest_window_s: float = 60.0
    #: Notices a process buffers for its sender thread; past it they are dropped.
    notify_queue_size: int = 10_000

    @property
    def notify_event_names(self) -> tuple[str, ...]:
        """``notify_events`` as a tuple of signal names."""
        return tuple(n.strip() for n in self.notify_events.split(",") if n.strip())

    @property
    def notify_on(self) -> bool:
        """Whether a built-in notifier is switched on."""
        return bool(self.notify_webhook_url or self.notify_mail)

    def _check_notify(self) -> None:
        check_positive(self, "notify_window_s", "notify_digest_window_s",
                       "notify_webhook_timeout_s", "notify_queue_size")
        check_not_negative(self, "notify_streak", "notify_webhook_retries",
                           "notify_digest_threshold")
        unknown = [n for n in self.notify_event_names if n not in SIGNAL_NAMES]
        if unknown:
            raise ConfigurationError(
                f"{SETTING_PREFIX}notify_events: unknown signal {unknown[0]!r}; known: "
                + ", ".join(SIGNAL_NAMES))
        url = self.notify_webhook_url
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigurationError(
                    f"{SETTING_PREFIX}notify_webhook_url must be an http:// or https:// URL, "
                    f"got {url!r}")
        elif self.notify_webhook_secret:
            raise ConfigurationError(
                f"{SETTING_PREFIX}notify_webhook_secret is set but "
                f"{SETTING_PREFIX}notify_webhook_url is empty")
