"""Due-time arithmetic: intervals, cron in an IANA zone across DST, backoff, jitter.

All results are UTC epoch milliseconds. Cron slots are found on the naive wall
clock of the job's zone and then mapped to UTC, so DST gaps and folds are
handled explicitly instead of by whatever the iterator does with aware times.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from croniter import croniter

UTC = timezone.utc
# Largest DST shift in the tz database is 2 h; look that far around folds.
_DST_WINDOW = timedelta(hours=2, minutes=1)
_MAX_CANDIDATES = 2000


def ms_to_dt(ms: int) -> datetime:
    """UTC datetime of an epoch-millisecond value."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def dt_to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    return round(dt.timestamp() * 1000)


def _hour_is_wildcard(expr: str) -> bool:
    hour = expr.split()[1]
    return hour.startswith("*")


def _wall_to_utc(wall: datetime, tz: ZoneInfo, fold: int) -> tuple[datetime, bool, bool]:
    """Map a naive wall time to UTC; also report (is_gap, is_ambiguous)."""
    aware = wall.replace(tzinfo=tz, fold=fold)
    utc = aware.astimezone(UTC)
    other = wall.replace(tzinfo=tz, fold=1 - fold)
    differs = aware.utcoffset() != other.utcoffset()
    roundtrip = utc.astimezone(tz).replace(tzinfo=None)
    is_gap = differs and roundtrip != wall
    return utc, is_gap, differs and not is_gap


def cron_next(expr: str, tz: ZoneInfo, after: datetime) -> datetime:
    """The first slot of ``expr`` in ``tz`` strictly after ``after`` (aware), in UTC.

    DST rules (the same as Vixie cron's intent):

    * a wall time skipped by a spring-forward gap fires shifted forward by the
      gap (02:30 on a 02:00->03:00 day fires at 03:30 local);
    * a wall time repeated by a fall-back fold fires once, at its first
      instant, unless the hour field is a wildcard (``*/15 * * * *``), whose
      job keeps firing every 15 real minutes through the repeated hour.
    """
    after_utc = after.astimezone(UTC)
    wall_after = after_utc.astimezone(tz).replace(tzinfo=None)
    both_folds = _hour_is_wildcard(expr)
    it = croniter(expr, wall_after - _DST_WINDOW)
    best: datetime | None = None
    best_wall: datetime | None = None
    for _ in range(_MAX_CANDIDATES):
        wall: datetime = it.get_next(datetime)
        if best_wall is not None and wall > best_wall + _DST_WINDOW:
            break
        for fold in (0, 1):
            utc, is_gap, is_ambiguous = _wall_to_utc(wall, tz, fold)
            if fold == 1 and (is_gap or not is_ambiguous or not both_folds):
                continue
            if utc > after_utc and (best is None or utc < best):
                best, best_wall = utc, wall
    if best is None:
        raise ValueError(f"cron {expr!r} has no slot in the foreseeable future")
    return best


def cron_is_valid(expr: str) -> bool:
    """A 5-field cron expression that croniter accepts."""
    return len(expr.split()) == 5 and bool(croniter.is_valid(expr))


def jitter_ms(jitter_s: float, rng: random.Random) -> int:
    """A uniform delay in ``[0, jitter_s]`` seconds, in ms.

    Jitter only ever delays, so a job never runs more often than its interval
    (scrape targets keep their politeness budget).
    """
    if jitter_s <= 0:
        return 0
    return int(rng.uniform(0, jitter_s) * 1000)


def backoff_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Delay before retry number ``attempt`` (1-based): base * 2**(attempt-1), capped."""
    return float(min(cap_s, base_s * (2 ** max(0, attempt - 1))))
