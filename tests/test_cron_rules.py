"""Fire times follow the written rules (invariant 10).

* A Celery ``crontab`` from ``beat_schedule`` fires exactly when Celery's own
  ``crontab`` says, checked against ``celery.schedules.crontab`` itself over a
  whole year for well over a hundred crontabs.
* A cron string follows crontab(5) (Vixie cron, cronie), checked against a
  brute-force enumerator of the man page's rule.
* ``day_rule`` picks the rule, on every entry point.
* In a DST fold, a job whose hour field matches all 24 hours fires in both
  passes; any other job fires once.
"""

from __future__ import annotations

import calendar
import itertools
import random
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_zsched.config import Settings
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.formats import read_rows
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.rows import parse_rows, write_rows
from celery_zsched.core.timing import cron_next, dt_to_ms, ms_to_dt
from celery_zsched.services.beat_entries import job_from_entry
from celery_zsched.store import Store

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
YEAR = 2026
START = datetime(YEAR, 1, 1, tzinfo=UTC)
END = datetime(YEAR + 1, 1, 1, tzinfo=UTC)
NO_JITTER = Settings(max_jitter_s=0)


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _job_fires(job: Job, start: datetime, end: datetime) -> list[datetime]:
    """The job's successive next runs (Job.next_regular_ms, no jitter) in [start, end)."""
    out: list[datetime] = []
    rng = random.Random(0)
    t = dt_to_ms(start) - 1
    end_ms = dt_to_ms(end)
    while True:
        nxt = job.next_regular_ms(t, NO_JITTER, rng)
        assert nxt is not None and nxt > t
        if nxt >= end_ms:
            return out
        out.append(ms_to_dt(nxt))
        t = nxt


# ================================================== 1. Celery crontab parity
def _celery_app(tz: str) -> Celery:
    app = Celery("parity", set_as_current=False)
    app.conf.timezone = tz
    app.conf.enable_utc = True
    return app


def _celery_fires(spec: dict[str, Any], app: Celery, start: datetime,
                  end: datetime) -> tuple[crontab, list[datetime]]:
    """Fires of ``crontab(**spec)`` in [start, end), as Celery's own crontab computes them.

    Beat asks ``remaining_estimate(last_run_at)`` (through ``is_due``) how long
    until the next run; chaining it from each fire enumerates the schedule
    with Celery's own code, not a copy of its rules.
    """
    clock = [start]
    sched = crontab(app=app, nowfun=lambda: clock[0], **spec)
    out: list[datetime] = []
    t = start - timedelta(microseconds=1)
    while True:
        clock[0] = t
        t = (t + sched.remaining_estimate(t)).astimezone(UTC)
        if t >= end:
            return sched, out
        out.append(t)


def _assert_due_exactly_at(sched: crontab, fires: list[datetime], clock: list[datetime]) -> None:
    """Cross-check: Celery's is_due says "due" at each fire, "not yet" a second before it."""
    for last, fire in itertools.pairwise(fires):
        clock[0] = fire - timedelta(seconds=1)
        assert not sched.is_due(last).is_due
        clock[0] = fire
        assert sched.is_due(last).is_due


# Hand-written: every kind of spelling Celery takes, both day fields together.
HAND_WRITTEN: list[dict[str, Any]] = [
    {"minute": 0, "hour": 12, "day_of_month": "1-7", "day_of_week": "mon"},  # 1st Monday
    {"minute": 30, "hour": 8, "day_of_month": "8-14", "day_of_week": "tue,thu"},
    {"minute": 0, "hour": 0, "day_of_month": "13", "day_of_week": "fri"},  # Friday 13th
    {"minute": 0, "hour": 0, "day_of_month": "*/2", "day_of_week": "1"},
    {"minute": 15, "hour": "*/6", "day_of_month": "1,15", "day_of_week": "mon-fri"},
    {"minute": 0, "hour": 9, "day_of_month": "25-31", "day_of_week": "sun"},  # last Sunday
    {"minute": 5, "hour": 3, "day_of_month": "1-10/3", "day_of_week": "sat,sun"},
    {"minute": 0, "hour": 6, "day_of_month": {1, 2, 3}, "day_of_week": {1, 2}},
    {"minute": 45, "hour": 23, "day_of_month": range(20, 29), "day_of_week": range(0, 3)},
    {"minute": 0, "hour": 12, "day_of_month": 31, "day_of_week": "wed"},
    {"minute": 0, "hour": 7, "day_of_month": "29", "day_of_week": "*", "month_of_year": "feb"},
    {"minute": 0, "hour": 0, "day_of_month": "1", "month_of_year": "*/3"},
    {"minute": 0, "hour": 0, "day_of_month": "15", "month_of_year": "2-12/5"},
    {"minute": 0, "hour": 10, "month_of_year": "jan,apr,jul,oct", "day_of_week": "mon"},
    {"minute": 0, "hour": 10, "month_of_year": "feb-apr", "day_of_month": "*/10",
     "day_of_week": "mon-wed"},
    {"minute": "*/15", "hour": "9-17", "day_of_week": "mon-fri"},
    {"minute": {0, 30}, "hour": range(9, 18)},
    {"minute": range(0, 60, 20), "hour": "*/4", "day_of_week": "Monday"},
    {"minute": "5-50/15", "hour": "1,13", "day_of_month": "*/7"},
    {"minute": "0,10,20", "hour": "*/3,5", "day_of_week": "fri-mon"},
    {"minute": 0},
    {"minute": 59, "hour": 23, "day_of_month": "28-31", "month_of_year": "*/2"},
    {"minute": 0, "hour": 0, "day_of_week": "sun-sat", "day_of_month": "1-31"},
    {"minute": 1, "hour": 1, "day_of_week": "mon-fri/2", "day_of_month": "2-30/7"},
    {"minute": 0, "hour": 18, "day_of_week": "sat", "month_of_year": 12},
    {"minute": 20, "hour": "0-23/5", "day_of_month": [5, 10, 15], "day_of_week": [3, 4]},
]

_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                "dec")


def _random_field(rng: random.Random, low: int, high: int, names: tuple[str, ...] = (),
                  most: int | None = None) -> Any:
    """A random Celery cronspec for a field of [low, high], in one of its spellings."""
    most = most or high - low + 1
    a = rng.randint(low, high)
    b = rng.randint(a, min(high, a + most - 1))
    step = rng.randint(2, max(2, (high - low + 1) // 2))
    picks = sorted(rng.sample(range(low, high + 1), rng.randint(1, min(4, most))))
    spellings: list[Any] = [
        a, str(a), f"{a}-{b}", f"{a}-{b}/{step}", ",".join(map(str, picks)), set(picks),
        range(a, b + 1), list(picks),
    ]
    if (high - low + 1) // step <= most:
        spellings.append(f"*/{step}")
    if names:
        spellings.append(",".join(names[p - low] for p in picks))
        spellings.append(f"{names[a - low]}-{names[b - low]}")
    if most >= high - low + 1:
        spellings.append("*")
    return rng.choice(spellings)


def _random_crontabs(count: int, seed: int) -> list[dict[str, Any]]:
    """Random crontabs with both day fields given in most of them; dense ones capped."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(count):
        spec: dict[str, Any] = {
            "minute": _random_field(rng, 0, 59, most=3),
            "hour": _random_field(rng, 0, 23, most=8),
            # Up to the 28th: every month has it, so no spec is "never" by chance.
            "day_of_month": _random_field(rng, 1, 28),
            "day_of_week": _random_field(rng, 0, 6, _DOW_NAMES),
        }
        if rng.random() < 0.5:
            spec["month_of_year"] = _random_field(rng, 1, 12, _MONTH_NAMES)
        if rng.random() < 0.15:
            del spec[rng.choice(("day_of_month", "day_of_week"))]
        out.append(spec)
    return out


def _compare(specs: list[dict[str, Any]], tz: str,
             skip_days: frozenset[date] = frozenset()) -> tuple[int, int]:
    """Check each spec against Celery over the year in ``tz``; return (crontabs, fires)."""
    app = _celery_app(tz)
    zone = ZoneInfo(tz)
    matched = 0
    for spec in specs:
        sched, expected = _celery_fires(spec, app, START, END)
        job = job_from_entry("parity", {"task": "t", "schedule": sched}, Defaults())
        assert job.timezone == tz
        got = _job_fires(job, START, END)

        def kept(fires: list[datetime]) -> list[datetime]:
            return [f for f in fires if f.astimezone(zone).date() not in skip_days]
        expected, got = kept(expected), kept(got)
        assert got == expected, f"{spec} -> {job.cron!r}: " + _first_difference(expected, got)
        assert job.day_rule == "and"
        matched += len(got)
    return len(specs), matched


def _first_difference(expected: list[datetime], got: list[datetime]) -> str:
    for i, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e != g:
            return f"fire {i}: Celery {e.isoformat()}, ours {g.isoformat()}"
    return f"Celery fires {len(expected)} times, ours {len(got)}"


def test_first_monday_of_the_month_fires_only_on_first_mondays() -> None:
    """Celery's idiom day_of_month="1-7", day_of_week="mon" fires 12 times a year, not ~60."""
    app = _celery_app("UTC")
    sched = crontab(minute=0, hour=12, day_of_month="1-7", day_of_week="mon", app=app)
    job = job_from_entry("first-monday", {"task": "t", "schedule": sched}, Defaults())
    assert (job.cron, job.day_rule) == ("0 12 1-7 * 1", "and")
    fires = _job_fires(job, START, END)
    assert len(fires) == 12
    assert all(f.weekday() == 0 and f.day <= 7 and f.hour == 12 for f in fires)
    assert [f.month for f in fires] == list(range(1, 13))


def test_static_crontab_fires_exactly_when_celery_crontab_says(
    record_property: Callable[[str, object], None],
) -> None:
    """A year of fires of 226 crontabs equals Celery's own, fire for fire (UTC)."""
    specs = HAND_WRITTEN + _random_crontabs(200, seed=20260101)
    crontabs, fires = _compare(specs, "UTC")
    record_property("celery_parity_utc_crontabs", crontabs)
    record_property("celery_parity_utc_fires", fires)
    print(f"\nCelery crontab parity (UTC, {YEAR}): {crontabs} crontabs, {fires} fires matched")
    assert crontabs == len(HAND_WRITTEN) + 200
    assert fires > 50_000


def test_static_crontab_in_a_dst_zone_matches_celery_outside_dst_transitions(
    record_property: Callable[[str, object], None],
) -> None:
    """In Europe/Berlin the fires equal Celery's on every day but the two DST change days."""
    transitions = frozenset({date(YEAR, 3, 29), date(YEAR, 10, 25)})
    crontabs, fires = _compare(HAND_WRITTEN + _random_crontabs(30, seed=7), "Europe/Berlin",
                               transitions)
    record_property("celery_parity_berlin_crontabs", crontabs)
    record_property("celery_parity_berlin_fires", fires)
    print(f"\nCelery crontab parity (Europe/Berlin, {YEAR}): {crontabs} crontabs, "
          f"{fires} fires matched")
    assert fires > 10_000


def test_celery_is_due_agrees_with_the_fires_the_parity_test_uses() -> None:
    """The reference itself: Celery's is_due turns true exactly at each enumerated fire."""
    app = _celery_app("UTC")
    clock = [START]
    for spec in HAND_WRITTEN[:10]:
        sched = crontab(app=app, nowfun=lambda: clock[0], **spec)
        _, fires = _celery_fires(spec, app, START, START + timedelta(days=120))
        _assert_due_exactly_at(sched, fires[:40], clock)


# ==================================================== 2. crontab(5) cron strings
_CRON_NAMES = {3: {n: i + 1 for i, n in enumerate(_MONTH_NAMES)},
               4: {n: i for i, n in enumerate(_DOW_NAMES)}}
_CRON_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _crontab5_field(text: str, index: int) -> set[int]:
    """The values of one field, parsed as crontab(5) describes (numbers, names, -, /, ,)."""
    low, high = _CRON_BOUNDS[index]
    names = _CRON_NAMES.get(index, {})

    def number(token: str) -> int:
        return names[token] if token in names else int(token)

    out: set[int] = set()
    for part in text.lower().split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (number(t) for t in span.split("-"))
        else:
            first = last = number(span)
        out.update(range(first, last + 1, int(step or 1)))
    if index == 4 and 7 in out:  # 0 and 7 are both Sunday
        out = (out - {7}) | {0}
    return out


def _crontab5_fires(expr: str, year: int) -> list[datetime]:
    """Brute force over every day of ``year`` (UTC), with crontab(5)'s day rule:

    "If both fields are restricted (i.e., do not start with *), the command will
    be run when either field matches the current time" -- else both must match.
    """
    fields = expr.split()
    minutes, hours, doms, months, dows = (_crontab5_field(f, i) for i, f in enumerate(fields))
    either = not fields[2].startswith("*") and not fields[4].startswith("*")
    out: list[datetime] = []
    for month in sorted(months):
        for day in range(1, calendar.monthrange(year, month)[1] + 1):
            dom_ok = day in doms
            dow_ok = (date(year, month, day).weekday() + 1) % 7 in dows
            if (dom_ok or dow_ok) if either else (dom_ok and dow_ok):
                out += [datetime(year, month, day, h, m, tzinfo=UTC)
                        for h in sorted(hours) for m in sorted(minutes)]
    return out


CRONTAB5_EXPRESSIONS = [
    "0 0 */2 * 1",        # the example: odd-day Mondays only
    "0 0 */2 * mon",
    "0 12 1-7 * mon",     # both restricted: every day 1-7 and every Monday
    "0 0 13 * 5",         # Friday the 13th in Celery; the 13th or any Friday in cron
    "0 0 1-31 * 1",       # both restricted although 1-31 covers the month: every day
    "0 0 */1 * 5",        # */1 starts with *: Fridays only
    "0 0 13 * */2",       # */2 in the day of week: the 13th on Sun, Tue, Thu, Sat
    "0 0 * * 7",          # 7 is Sunday
    "0 0 * * 5-7",
    "30 6 * * 1-5",
    "0 0 1,15 * 3",
    "15 3 */10 */2 *",
    "0 9 */3 jan-mar sat",
    "0 9 1-10/3 * sun,wed",
    "0 0 28-31 * *",
    "5 4 * * sun",
    "0 22 * * 1-5/2",
    "0 0 * feb,apr */3",
    "0 0 29 2 *",
    "0 0 * * 5-5",        # a one-value range is that value (croniter alone reads it as "*")
    "0 3-3/2 * * fri-FRI",
    "0 0 1 3-3 *",
    "0 0 7-7 * 0-0",
]


def _random_crontab5(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def field(low: int, high: int, stars: bool) -> str:
        a = rng.randint(low, high)
        b = rng.randint(a, high)
        step = rng.randint(2, 4)
        options = [str(a), f"{a}-{b}", f"{a}-{b}/{step}", f"{a},{b}"]
        if stars:
            options += ["*", f"*/{step}", f"*/{step}"]
        return rng.choice(options)

    out = []
    for _ in range(count):
        minute = str(rng.randint(0, 59))
        hour = rng.choice([str(rng.randint(0, 23)), f"{rng.randint(0, 11)},{rng.randint(12, 23)}"])
        out.append(" ".join([minute, hour, field(1, 28, True), field(1, 12, True),
                             field(0, 6, True)]))
    return out


def test_cron_strings_follow_crontab5_day_rules(
    record_property: Callable[[str, object], None],
) -> None:
    """A year of fires of 140+ expressions equals a brute-force crontab(5) enumerator."""
    expressions = CRONTAB5_EXPRESSIONS + _random_crontab5(120, seed=5)
    fires = 0
    for expr in expressions:
        job = Job.from_dict({"id": "c5", "task": "t", "cron": expr})
        assert job.day_rule == "or"
        expected = _crontab5_fires(expr, YEAR)
        got = _job_fires(job, START, END)
        assert got == expected, f"{expr!r}: " + _first_difference(expected, got)
        fires += len(got)
    record_property("crontab5_expressions", len(expressions))
    record_property("crontab5_fires", fires)
    print(f"\ncrontab(5) parity ({YEAR}): {len(expressions)} expressions, {fires} fires matched")


def test_a_star_prefixed_day_field_is_unrestricted() -> None:
    """`0 0 */2 * 1` fires only on odd-day Mondays; with "and" too; `0 0 2 * 1` ORs."""
    odd_mondays = _job_fires(Job.from_dict({"id": "s", "task": "t", "cron": "0 0 */2 * 1"}),
                             START, END)
    assert odd_mondays and all(f.weekday() == 0 and f.day % 2 == 1 for f in odd_mondays)
    assert len(odd_mondays) == 26
    either = _job_fires(Job.from_dict({"id": "e", "task": "t", "cron": "0 0 2 * 1"}), START, END)
    second_mondays = sum(1 for f in either if f.day == 2 and f.weekday() == 0)
    assert second_mondays == 3
    assert len(either) == 52 + 12 - second_mondays  # Mondays, plus the 2nds


# ============================================================ day_rule field
def _cron_job(**fields: Any) -> Job:
    return Job.from_dict({"id": "d", "task": "t", "cron": "0 12 1-7 * mon", **fields})


@pytest.mark.parametrize(("given", "stored"), [("and", "and"), ("AND", "and"), (" or ", "or"),
                                               ("", "or"), (None, "or")])
def test_day_rule_accepts_or_and_and(given: str | None, stored: str) -> None:
    """day_rule is "or" or "and" (any case); empty or missing is crontab(5)'s "or"."""
    assert _cron_job(day_rule=given).day_rule == stored


@pytest.mark.parametrize("bad", ["xor", "both", 1, True, ["and"]])
def test_day_rule_rejects_anything_else_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError) as err:
        Job.from_dict({"id": "d", "task": "t", "cron": "0 0 * * *", "day_rule": bad}, row=4)
    assert err.value.field == "day_rule"
    assert str(err.value).startswith("line 4: day_rule:")


def test_day_rule_picks_the_fires() -> None:
    """The same expression: "and" fires on first Mondays, "or" on days 1-7 and Mondays."""
    both = _job_fires(_cron_job(day_rule="and"), START, END)
    either = _job_fires(_cron_job(), START, END)
    assert len(both) == 12
    assert len(either) == 12 * 7 + 52 - 12
    assert set(both) < set(either)


def test_day_rule_is_only_kept_on_cron_jobs() -> None:
    """It means nothing without a cron: an interval or one-off job stores the default."""
    assert Job.from_dict({"id": "i", "task": "t", "interval_s": 5, "day_rule": "and"}
                         ).day_rule == "or"
    assert Job.from_dict({"id": "o", "task": "t", "run_at": 1e9, "day_rule": "and"}
                         ).day_rule == "or"


def test_an_expression_that_never_fires_under_and_is_rejected() -> None:
    """April has no 31st: "0 0 31 4 1" fires on April Mondays under "or", never under "and"."""
    assert _cron_job(cron="0 0 31 4 1").day_rule == "or"
    with pytest.raises(ValidationError, match="never fires"):
        _cron_job(cron="0 0 31 4 1", day_rule="and")


def test_day_rule_moves_the_timing_signature_but_the_default_keeps_the_old_one() -> None:
    """An edit of day_rule reschedules; jobs stored before day_rule existed keep their signature."""
    import hashlib

    job = _cron_job()
    old = f"{job.interval_s}|{job.cron}|{job.timezone}|{job.run_at}|{job.start_at}"
    assert job.timing_signature == hashlib.sha1(old.encode()).hexdigest()[:10]
    assert _cron_job(day_rule="and").timing_signature != job.timing_signature


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_day_rule_survives_export_and_import(fmt: str, tmp_path: Any) -> None:
    """Written by write_rows and read back by read_rows/parse_rows in every format."""
    jobs = [_cron_job(id="and-job", day_rule="and"), _cron_job(id="or-job")]
    path = tmp_path / f"jobs.{fmt}"
    with path.open("w", encoding="utf-8") as fp:
        write_rows(jobs, fp, fmt)
    parsed = parse_rows(read_rows(path), Defaults())
    assert not parsed.errors
    assert [(j.id, j.day_rule) for j in parsed.jobs] == [("and-job", "and"), ("or-job", "or")]
    assert parsed.jobs == jobs


def test_csv_day_rule_column_is_read(tmp_path: Any) -> None:
    """A hand-written CSV with a day_rule column (an empty cell is the default)."""
    path = tmp_path / "jobs.csv"
    path.write_text("id,task,cron,day_rule\na,t,0 12 1-7 * mon,and\nb,t,0 12 1-7 * mon,\n",
                    encoding="utf-8")
    parsed = parse_rows(read_rows(path), Defaults())
    assert [(j.id, j.day_rule) for j in parsed.jobs] == [("a", "and"), ("b", "or")]


def test_store_keeps_day_rule_and_settles_by_it(store: Store) -> None:
    """Through Redis: stored, loaded back, and the next run after a settle is a first Monday."""
    job = _cron_job(id="first-monday", day_rule="and", jitter_s=0)
    store.upsert(job)
    info = store.get(job.id)
    assert info.job.day_rule == "and"
    assert info.due_ms is not None
    due = ms_to_dt(info.due_ms)
    assert (due.weekday(), due.day <= 7, due.hour) == (0, True, 12)


def test_cli_add_takes_day_rule(redis_url: str, make_store: Callable[..., Store],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`zsched add --day-rule and` stores it; a bad value is a usage error that writes nothing."""
    import importlib
    import uuid

    from celery.bin.celery import celery
    from click.testing import CliRunner

    from celery_zsched.services.appstore import forget_app

    prefix = "{dr" + uuid.uuid4().hex[:8] + "}:"
    monkeypatch.setenv("ZSCHED_REDIS_URL", redis_url)
    monkeypatch.setenv("ZSCHED_KEY_PREFIX", prefix)
    app = importlib.import_module("tests.cli_app").app
    forget_app(app)
    try:
        def run(*args: str) -> Any:
            return CliRunner().invoke(celery, ["-A", "tests.cli_app", "zsched", *args],
                                      catch_exceptions=False)
        bad = run("add", "--id", "x", "--task", "t", "--cron", "0 0 1 * 1", "--day-rule", "xor")
        assert bad.exit_code == 2, bad.output
        ok = run("add", "--id", "fm", "--task", "t", "--cron", "0 12 1-7 * mon",
                 "--day-rule", "AND", "--tz", "UTC", "--jitter", "0")
        assert ok.exit_code == 0, ok.output
        store = make_store(key_prefix=prefix)
        assert store.client.hlen(store.keys.defs) == 1
        info = store.get("fm")
        assert info.job.day_rule == "and"
        assert info.due_ms is not None and ms_to_dt(info.due_ms).weekday() == 0
        shown = run("show", "fm")
        assert '"day_rule": "and"' in shown.output
    finally:
        forget_app(app)


# ============================================= DST fold: which hours are wildcards
FOLD_DAY = (_utc("2026-10-24T22:00"), _utc("2026-10-25T23:00"))  # Berlin's 25-hour day
FIRST_0200, SECOND_0200 = _utc("2026-10-25T00:00"), _utc("2026-10-25T01:00")  # CEST, CET


@pytest.mark.parametrize(("expr", "count", "both_passes"), [
    ("0 * * * *", 25, True),
    ("0 */1 * * *", 25, True),
    ("0 0-23 * * *", 25, True),
    ("0 0-11,12-23 * * *", 25, True),
    ("0 0-23/1 * * *", 25, True),
    ("*/30 0-23 * * *", 50, True),
    ("0 */2 * * *", 12, False),
    ("0 1-23 * * *", 23, False),
    ("0 2 * * *", 1, False),
    ("0 2,14 * * *", 2, False),
])
def test_fold_repeats_only_jobs_whose_hour_field_matches_every_hour(
    expr: str, count: int, both_passes: bool,
) -> None:
    """Berlin 2026-10-25, 03:00 CEST -> 02:00 CET: the hour 02:00-03:00 happens twice.

    A job whose hour field matches all 24 hours, however it is spelled, fires in
    both passes; any other job fires once per wall-clock slot, in the first pass.
    """
    fires = []
    t = FOLD_DAY[0] - timedelta(milliseconds=1)
    while (t := cron_next(expr, BERLIN, t)) < FOLD_DAY[1]:
        fires.append(t)
    assert len(fires) == count
    assert FIRST_0200 in fires
    assert (SECOND_0200 in fires) is both_passes
    if both_passes:  # a real-time cadence: even spacing through the fold
        assert len({b - a for a, b in itertools.pairwise(fires)}) == 1

