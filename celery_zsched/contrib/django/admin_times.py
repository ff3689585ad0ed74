"""Clock times in the admin, always with their zone.

A bare "14:05" on an admin page is ambiguous: the admin renders in
``TIME_ZONE``, a cron job fires on its own zone's wall clock, and Redis keeps
UTC. Every time the admin shows goes through :func:`zoned`, and a job's page
names all three zones with :func:`zones_line`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils import timezone

#: Seconds precision, the admin's default for a time on another day.
FULL = "%Y-%m-%d %H:%M:%S %Z"
#: Same day: the date adds nothing.
CLOCK = "%H:%M:%S %Z"


def zoned(dt: datetime | None, fmt: str = FULL) -> str:
    """``dt`` in the admin's current zone (``TIME_ZONE``), with the zone's abbreviation."""
    if dt is None:
        return "-"
    if timezone.is_naive(dt):  # USE_TZ = False: the database holds TIME_ZONE wall times
        dt = timezone.make_aware(dt)
    return timezone.localtime(dt).strftime(fmt)


def offset(delta: timedelta | None) -> str:
    """``UTC+01:00``, ``UTC-05:00``, ``UTC+05:45``."""
    minutes = int((delta or timedelta()).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{mins:02d}"


def zone_or_none(name: str) -> ZoneInfo | None:
    """The zone called ``name``; ``None`` for any name that is not one.

    A form shown again with its errors holds whatever was typed: beyond unknown
    names, ``ZoneInfo`` raises ``ValueError`` for malformed keys and
    ``OSError`` for a folder of the database ("Europe") or an overlong name.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def zone_label(name: str, at: datetime) -> str:
    """``Europe/Berlin (CET, UTC+01:00)`` as of ``at`` (the abbreviation follows DST)."""
    zone = zone_or_none(name)
    if zone is None:
        return f"{name} (unknown zone)"
    local = at.astimezone(zone)
    abbrev = local.tzname() or ""
    off = offset(local.utcoffset())
    # Zones without a letter abbreviation report the offset itself ("+04").
    shown = off if not abbrev or abbrev[0] in "+-" else f"{abbrev}, {off}"
    return f"{name} ({shown})"


def zones_line(job_zone: str, at: datetime | None = None) -> str:
    """The job's zone beside the admin's (``TIME_ZONE``) and UTC, as of ``at`` (now)."""
    at = at or timezone.now()
    admin_zone = timezone.get_current_timezone_name()
    if admin_zone == job_zone:
        parts = [f"job and times on this page: {zone_label(job_zone, at)}"]
    else:
        parts = [f"job: {zone_label(job_zone, at)}",
                 f"times on this page: {zone_label(admin_zone, at)}"]
    parts.append("Redis keeps UTC")
    return " · ".join(parts)
