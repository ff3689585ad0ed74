"""Due-time arithmetic: intervals, cron in an IANA zone across DST, backoff, jitter.

All results are UTC epoch milliseconds. Cron slots are found on the naive wall
clock of the job's zone and then mapped to UTC, so DST gaps and folds are
handled explicitly instead of by whatever the iterator does with aware times.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from croniter import croniter

UTC = timezone.utc
# Largest DST shift in the tz database is 2 h; look that far around folds.
_DST_WINDOW = timedelta(hours=2, minutes=1)
_MAX_CANDIDATES = 2000
# Longest gap to the next slot that the quick path (one offset throughout) answers.
_STEADY_SPAN = timedelta(days=1)


def ms_to_dt(ms: int) -> datetime:
    """UTC datetime of an epoch-millisecond value."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def dt_to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    return round(dt.timestamp() * 1000)


#: Which cron rule joins the day-of-month and day-of-week fields (see :func:`cron_next`).
DAY_RULES = ("or", "and")


# Cached: the same few expressions are asked about for every job that shares them.
@functools.lru_cache(maxsize=4096)
def _hour_is_wildcard(expr: str) -> bool:
    """The hour field matches all 24 hours, whatever its spelling.

    ``*``, ``*/1``, ``0-23`` and ``0-11,12-23`` are all wildcards; ``*/2`` and
    ``1-23`` are not. The meaning, not the spelling, decides, so two ways of
    writing the same schedule never fire differently in a DST fold.
    """
    # croniter expands a field that covers its whole range to ["*"].
    return bool(croniter.expand(_single_values(expr))[0][1] == ["*"])


def _single_values(expr: str) -> str:
    """``expr`` with each one-value range (``5-5``, ``fri-fri``, ``5-5/2``) written as the value.

    crontab(5) reads ``5-5`` as 5, but croniter deliberately reads a range
    whose ends are equal as the whole field, so ``0 0 * * 5-5`` would fire
    every day instead of on Fridays.
    """
    return " ".join(",".join(_single(part) for part in field.split(","))
                    for field in expr.split())


def _single(part: str) -> str:
    low, dash, high = part.split("/", 1)[0].partition("-")
    same = low.lower() == high.lower() or (low.isdigit() and high.isdigit()
                                           and int(low) == int(high))
    return low if dash and low and same else part


# Cached: parsing the expression is three quarters of a croniter's cost, and
# a fleet shares a handful of expressions. Callers get a copy (see _walker).
@functools.lru_cache(maxsize=1024)
def _template(expr: str, day_rule: str) -> croniter:
    if day_rule not in DAY_RULES:
        raise ValueError(f"day_rule must be one of {DAY_RULES}, got {day_rule!r}")
    # "or" is crontab(5) as Vixie cron and cronie run it: the fields are ORed
    # only when both are restricted, and a field starting with "*" (even
    # "*/2") is unrestricted, so the two are ANDed. croniter calls that rule
    # implement_cron_bug. "and" is Celery's crontab: both must always match.
    return croniter(_single_values(expr), 0.0, day_or=day_rule == "or",
                    implement_cron_bug=True)


def _walker(expr: str, start: datetime, day_rule: str) -> croniter:
    """A croniter over naive wall times from ``start``, joining the day fields by ``day_rule``."""
    # A shallow copy is enough: iterating only rebinds the position attributes,
    # never mutates the parsed fields, so threads never share a position.
    it = copy.copy(_template(expr, day_rule))
    it.set_current(start, force=True)
    return it


def _wall_to_utc(wall: datetime, tz: ZoneInfo, fold: int) -> tuple[datetime, bool, bool]:
    """Map a naive wall time to UTC; also report (is_gap, is_ambiguous)."""
    aware = wall.replace(tzinfo=tz, fold=fold)
    utc = aware.astimezone(UTC)
    other = wall.replace(tzinfo=tz, fold=1 - fold)
    differs = aware.utcoffset() != other.utcoffset()
    roundtrip = utc.astimezone(tz).replace(tzinfo=None)
    is_gap = differs and roundtrip != wall
    return utc, is_gap, differs and not is_gap


def cron_next(expr: str, tz: ZoneInfo, after: datetime, day_rule: str = "or") -> datetime:
    """The first slot of ``expr`` in ``tz`` strictly after ``after`` (aware), in UTC.

    Day fields (``day_rule``):

    * ``"or"`` (crontab(5), Vixie cron and cronie): when both day-of-month and
      day-of-week are restricted, either one matching fires; a field that
      starts with ``*`` (``*/2`` too) is unrestricted, so then both must match
      (``0 0 */2 * 1`` fires on odd-day Mondays only);
    * ``"and"`` (Celery's ``crontab``): both fields must always match.

    DST rules (the same as Vixie cron's intent):

    * a wall time skipped by a spring-forward gap fires shifted forward by the
      gap (02:30 on a 02:00->03:00 day fires at 03:30 local);
    * a wall time repeated by a fall-back fold fires once, at its first
      instant, unless the hour field is a wildcard, i.e. matches all 24 hours
      (``*``, ``*/1``, ``0-23``): that job keeps its real-time cadence and fires
      in both passes of the repeated hour. ``*/2`` or ``1-23`` are not wildcards.
    """
    after_utc = after.astimezone(UTC)
    wall_after = after_utc.astimezone(tz).replace(tzinfo=None)
    quick = _steady_next(expr, tz, after_utc, wall_after, day_rule)
    if quick is not None:
        return quick
    both_folds = _hour_is_wildcard(expr)
    it = _walker(expr, wall_after - _DST_WINDOW, day_rule)
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


def cron_dst_flags(expr: str, tz: ZoneInfo, slot: datetime,
                   day_rule: str = "or") -> tuple[bool, bool]:
    """(shifted, repeated) of ``slot``, a result of :func:`cron_next`, by its DST rules.

    *shifted*: the wall time it stands for was skipped by a gap, so it fires
    later on the wall clock (02:30 fires at 03:30). *repeated*: its wall time
    comes twice in a fold and the job fires in both passes (an hour-wildcard
    cron); a fold wall time that fires once, in its first pass, is not.
    """
    local = slot.astimezone(tz)
    wall = local.replace(tzinfo=None)
    before = (slot - _DST_WINDOW).astimezone(tz).utcoffset()
    offset = local.utcoffset()
    shifted = False
    if before is not None and offset is not None and before != offset:
        # A gap slot maps (fold=0, the offset before the gap) to its wall time
        # plus the gap, so the wall time it was meant for is that much earlier.
        meant = wall - (offset - before)
        utc, is_gap, _ = _wall_to_utc(meant, tz, 0)
        shifted = is_gap and utc == slot.astimezone(UTC) and _matches(expr, meant, day_rule)
    _, _, ambiguous = _wall_to_utc(wall, tz, 0)
    return shifted, ambiguous and _hour_is_wildcard(expr)


def _matches(expr: str, wall: datetime, day_rule: str) -> bool:
    """``wall`` (naive, whole minute) is a slot of ``expr``."""
    nxt: datetime = _walker(expr, wall - timedelta(seconds=1), day_rule).get_next(datetime)
    return nxt == wall


def _steady_next(expr: str, tz: ZoneInfo, after_utc: datetime, wall_after: datetime,
                 day_rule: str) -> datetime | None:
    """The next slot when no UTC offset change is near; ``None`` asks for the careful walk.

    With one UTC offset from a DST window before ``after`` to a DST window
    after the slot, wall time and UTC move in step, so the first wall slot
    after ``after`` is the answer. That is nearly every call, and it costs one
    croniter step instead of a walk over four hours of candidates.
    """
    offset = after_utc.astimezone(tz).utcoffset()
    wall: datetime = _walker(expr, wall_after, day_rule).get_next(datetime)
    assert offset is not None
    utc = (wall - offset).replace(tzinfo=UTC)
    # Within a day, at most one transition can lie between the two checks (DST
    # changes are weeks apart), and one would show as differing offsets.
    if not after_utc < utc <= after_utc + _STEADY_SPAN:
        return None
    for probe in (after_utc - _DST_WINDOW, utc + _DST_WINDOW):
        if probe.astimezone(tz).utcoffset() != offset:
            return None
    return utc


def cron_is_valid(expr: str) -> bool:
    """A 5-field cron expression that croniter accepts."""
    return len(expr.split()) == 5 and bool(croniter.is_valid(expr))


_CRON_FIELD_NAMES = "minute hour day-of-month month day-of-week"
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: Each field's label in messages, its numeric range and its names.
_CRON_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minutes", 0, 59, ()), ("hours", 0, 23, ()), ("days of month", 1, 31, ()),
    ("months", 1, 12, _MONTHS), ("days of week", 0, 7, _DAYS))
_DIGITS = re.compile("[0-9]+")


def cron_mistake(expr: str) -> str | None:
    """Which part of a cron expression is wrong, in words, or None if no part is to blame.

    Only names the culprit (``'61' is not in 0-59 for minutes``): croniter
    (:func:`cron_is_valid`) alone decides whether an expression is valid, so
    call this only for one that it rejected.
    """
    fields = expr.split()
    if len(fields) != 5:
        return f"expected 5 fields ({_CRON_FIELD_NAMES}), got {len(fields)}"
    for text, (label, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in text.split(","):
            problem = _cron_part_mistake(part, label, low, high, names)
            if problem:
                return problem
    return None


def _cron_part_mistake(part: str, label: str, low: int, high: int,
                       names: tuple[str, ...]) -> str | None:
    if not part:
        return f"empty list item (a stray ',') for {label}"
    base, slash, step = part.partition("/")
    if slash and not (_DIGITS.fullmatch(step) and int(step) > 0):
        return f"step {step!r} is not a whole number of 1 or more for {label}"
    if label == "days of month" and base[-1:] in ("W", "w"):
        base = base[:-1]  # 15W: the weekday nearest the 15th
    if label == "days of week":
        base = base.split("#", 1)[0]  # 5#2: the second Friday
        base = base[1:] if base[:1] in ("L", "l") and len(base) > 1 else base  # L5
    if base in ("*", "?", "L", "l"):
        return None
    ends = base.split("-", 1)
    span = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
    for end in ends:
        if _DIGITS.fullmatch(end):
            if not low <= int(end) <= high:
                return f"{end!r} is not in {low}-{high} for {label}"
        elif end.lower() not in names:
            return f"{end!r} is not in {span} for {label}"
    return None


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


# Cached: one bulk upsert asks for the same slot for every job that shares a
# cron expression and zone, and each answer costs about a millisecond.
@functools.lru_cache(maxsize=4096)
def cron_slot_after(expr: str, tz: str, ms: int, day_rule: str = "or") -> int:
    """The first slot of ``expr`` in zone ``tz`` after epoch ms ``ms``."""
    return dt_to_ms(cron_next(expr, ZoneInfo(tz), ms_to_dt(ms), day_rule))


# Cached: a fleet shares a handful of cron expressions, and croniter is the
# dearest step of parsing a cron row.
@functools.lru_cache(maxsize=4096)
def cron_problem(expr: str, day_rule: str = "or") -> str | None:
    """Why ``expr`` is no usable cron expression, or ``None``."""
    if not cron_is_valid(expr):
        return cron_mistake(expr) or "not a valid 5-field cron expression"
    try:
        # croniter accepts dates that never come ("0 0 31 2 *", or "0 0 31 4 1"
        # under the "and" day rule); storing one would fail mid-import, after
        # earlier chunks were written.
        cron_next(expr, ZoneInfo("UTC"), datetime.now(UTC), day_rule)
    except ValueError:
        return "never fires: no date matches it"
    return None
