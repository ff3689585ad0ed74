"""How the outbox stands: pending and dead-lettered changes, and the age of the oldest."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.conf import get_django_settings
from celery_zsched.contrib.django.models import ZSchedOutbox


@dataclass(frozen=True)
class OutboxStatus:
    """How the outbox stands: pending and dead-lettered changes, and the oldest pending one."""

    pending: int
    dead: int
    oldest_age_s: float
    #: ``zsched_outbox_warn_s``: the oldest pending change is older than this.
    warn_s: float

    @property
    def late(self) -> bool:
        """The oldest pending change is older than ``zsched_outbox_warn_s``."""
        return self.pending > 0 and self.oldest_age_s > self.warn_s

    @property
    def warning(self) -> str:
        """What to tell an operator ("" when all is well)."""
        parts = []
        if self.late:
            parts.append(f"the oldest of {self.pending} change(s) saved in the database is not "
                         f"in Redis after {self.oldest_age_s:.0f} s (over zsched_outbox_warn_s ="
                         f" {self.warn_s:g} s): is Redis reachable, and is beat running?")
        if self.dead:
            parts.append(f"{self.dead} change(s) failed zsched_outbox_max_attempts times and "
                         "are dead-lettered: see 'Changes not yet in Redis' in the admin")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``zsched_stats --json``)."""
        return {"pending": self.pending, "dead": self.dead,
                "oldest_age_s": round(self.oldest_age_s, 3), "warn_s": self.warn_s,
                "warning": self.warning}


def status(now: datetime | None = None) -> OutboxStatus:
    """Count the outbox (one query over its pending and dead entries, never the jobs)."""
    now = now or dj_timezone.now()
    pending_q = Q(dead_at__isnull=True)
    agg = ZSchedOutbox.objects.aggregate(
        pending=Count("pk", filter=pending_q), dead=Count("pk", filter=~pending_q),
        oldest=Min("created_at", filter=pending_q))
    oldest = agg["oldest"]
    age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return OutboxStatus(int(agg["pending"] or 0), int(agg["dead"] or 0), age,
                        get_django_settings().outbox_warn_s)
