"""Job definitions: validation, deterministic ids, (de)serialisation, next due times."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import numbers
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery_zsched.core.domains import domain_of, normalise_domain
from celery_zsched.core.errors import ValidationError, show_value
from celery_zsched.core.policy import JobPolicy
from celery_zsched.core.timing import (
    DAY_RULES,
    UTC,
    backoff_s,
    cron_is_valid,
    cron_mistake,
    cron_next,
    dt_to_ms,
    jitter_ms,
    ms_to_dt,
)

# \Z, not $: "$" also matches before a final newline, which let "job\n" pass.
_ID_RE = re.compile(r"^[A-Za-z0-9_.:@/\-]{1,200}\Z")
_TIME_FIELDS = ("run_at", "start_at", "end_at")


def id_problem(job_id: Any) -> str | None:
    """Why ``job_id`` cannot be a job id, or ``None``.

    Besides the characters: an id goes into URL paths (the REST API, the job
    gateway, the admin), where clients and proxies rewrite ``.`` and ``..``
    segments and merge ``//`` (``a/../b`` would name ``b``), and where a last
    segment ``executions`` names the runs route. Such ids are refused.
    """
    if not isinstance(job_id, str) or not _ID_RE.match(job_id):
        return "must be 1-200 characters of A-Z a-z 0-9 _ . : @ / -"
    segments = job_id.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return ("must not start or end with /, hold //, or have a . or .. segment "
                "(URL paths would rewrite it)")
    if len(segments) > 1 and segments[-1] == "executions":
        return "must not end in /executions (the REST API's route of a job's runs)"
    return None
#: Who may run a job: Celery workers (through beat) or HTTP workers (the gateway).
TRANSPORTS = ("celery", "http")
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def job_id_for_url(url: str) -> str:
    """The default id of a URL job: the first 12 hex digits of SHA-1 of the URL."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:12]


def definition_tag(stored: str | bytes) -> str:
    """The SHA-1 (hex) of a stored definition, as ``redis.sha1hex`` computes it: what a
    compare-and-set edit expects (:meth:`Store.upsert`) and the REST API's ETag."""
    raw = stored.encode("utf-8") if isinstance(stored, str) else stored
    return hashlib.sha1(raw).hexdigest()


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


@dataclass(frozen=True)
class Job:
    """One recurring (or one-off) job. Build it with :meth:`from_dict`, which validates."""

    id: str
    task: str
    interval_s: float | None = None
    cron: str | None = None
    timezone: str = "UTC"
    # How a cron's day-of-month and day-of-week fields combine: "or" is
    # crontab(5), "and" is Celery's crontab. Only cron jobs keep "and".
    day_rule: str = "or"
    run_at: int | None = None  # epoch ms
    name: str = ""
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    jitter_s: float | None = None
    queue: str | None = None
    routing_key: str | None = None
    priority: int | None = None
    expires_s: float | None = None
    enabled: bool = True
    start_at: int | None = None
    end_at: int | None = None
    max_runs: int | None = None
    misfire_grace_s: float | None = None
    retry_max: int | None = None
    retry_base_s: float | None = None
    #: Explicit pacing key (normalised host name); else the URL's host is used.
    domain: str | None = None
    #: Who runs it: ``celery`` (beat publishes it) or ``http`` (the job gateway
    #: hands it to a worker that long-polls ``GET /jobs/next``; beat never sees it).
    transport: str = "celery"

    # ------------------------------------------------------------------ build
    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], defaults: Defaults | None = None, row: int | None = None
    ) -> Job:
        """Validate a definition (an import row, a CLI call, a JSON value).

        Raises :class:`ValidationError` naming the field, the value and ``row``.
        """
        try:
            return _parse(data, defaults or Defaults())
        except ValidationError as exc:
            if row is None:
                raise
            raise exc.at_row(row) from None

    @classmethod
    def from_json(cls, raw: str | bytes) -> Job:
        """Load a definition stored by :meth:`to_json` (already validated)."""
        data = json.loads(raw)
        return cls(**{k: v for k, v in data.items() if k in _FIELD_SET})

    def to_json(self) -> str:
        """Compact JSON for Redis: fields at their default are left out."""
        # getattr, not dataclasses.asdict: asdict deep-copies every value, which
        # made this the slowest step of parsing an import row.
        data = {k: v for k in _FIELD_NAMES
                if (v := getattr(self, k)) != _FIELD_DEFAULTS.get(k, _MISSING)}
        data["id"], data["task"] = self.id, self.task
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """An import row that re-imports to this same job (times as ISO 8601 UTC)."""
        data: dict[str, Any] = json.loads(self.to_json())
        # to_json leaves out the Job default "UTC", but an importer fills a
        # missing zone from the app's zone, which may differ: always spell it out.
        data.setdefault("timezone", self.timezone)
        for name in _TIME_FIELDS:
            if name in data:
                data[name] = ms_to_dt(data[name]).isoformat().replace("+00:00", "Z")
        return data

    # ------------------------------------------------------------------ timing
    @property
    def kind(self) -> str:
        """``interval``, ``cron`` or ``once``."""
        if self.cron:
            return "cron"
        return "once" if self.run_at is not None else "interval"

    @property
    def timing_signature(self) -> str:
        """Changes exactly when an edit must move the job's schedule."""
        spec = f"{self.interval_s}|{self.cron}|{self.timezone}|{self.run_at}|{self.start_at}"
        if self.day_rule != "or":
            # Appended only when not the default, so the signature of every job
            # stored before day_rule existed stays the same (no mass reschedule).
            spec += f"|{self.day_rule}"
        return hashlib.sha1(spec.encode()).hexdigest()[:10]

    def effective_jitter_s(self, settings: JobPolicy) -> float:
        """The job's own jitter, else the global default."""
        return settings.max_jitter_s if self.jitter_s is None else self.jitter_s

    def first_due_ms(self, now_ms: int, settings: JobPolicy, rng: random.Random,
                     phase: float = 0.0) -> int | None:
        """When a newly stored job first runs; ``phase`` in [0, 1) staggers interval jobs."""
        jitter = jitter_ms(self.effective_jitter_s(settings), rng)
        if self.kind == "once":
            assert self.run_at is not None
            return self._clamp(self.run_at)
        if self.kind == "cron":
            base = max(now_ms, self.start_at or 0) - 1
            return self._clamp(self._cron_after(base) + jitter)
        assert self.interval_s is not None
        # The stagger and the jitter count from start_at when it is later than
        # now: clamping to start_at instead put a whole import at one instant.
        base = max(now_ms, self.start_at or 0)
        return self._clamp(base + round(phase * self.interval_s * 1000) + jitter)

    def next_regular_ms(self, now_ms: int, settings: JobPolicy, rng: random.Random) -> int | None:
        """The next run after one completes at ``now_ms``; ``None`` ends the job."""
        if self.kind == "once":
            return None
        jitter = jitter_ms(self.effective_jitter_s(settings), rng)
        if self.kind == "cron":
            due = self._cron_after(max(now_ms, (self.start_at or 0) - 1))
        else:
            assert self.interval_s is not None
            # round, not int: 2.01 s * 1000 is 2009.999..., which int() makes 2009 ms.
            due = max(now_ms + round(self.interval_s * 1000), self.start_at or 0)
        return self._clamp(due + jitter)

    def retry_due_ms(self, attempt: int, now_ms: int, settings: JobPolicy,
                     retry_after_s: float | None = None) -> int | None:
        """When retry number ``attempt`` runs, or ``None`` once retries are spent."""
        retry_max = settings.retry_max if self.retry_max is None else self.retry_max
        if attempt > retry_max:
            return None
        base = settings.retry_base_s if self.retry_base_s is None else self.retry_base_s
        delay = retry_after_s if retry_after_s is not None else backoff_s(
            attempt, base, settings.retry_cap_s)
        return self._clamp(now_ms + int(delay * 1000))

    def pacing_domain(self, settings: JobPolicy) -> str | None:
        """The domain this job is paced under, or ``None`` (pacing off, or nothing to pace)."""
        if not settings.pacing:
            return None
        return domain_of(self.url, self.domain, group_registrable=settings.domain_registrable)

    def misfire_grace_ms(self, settings: JobPolicy) -> int:
        """Lateness beyond which a fire is skipped; 0 never skips."""
        grace = settings.misfire_grace_s if self.misfire_grace_s is None else self.misfire_grace_s
        return int(grace * 1000)

    def _cron_after(self, ms: int) -> int:
        assert self.cron is not None
        return _cron_slot_after(self.cron, self.timezone, ms, self.day_rule)

    def _clamp(self, due: int) -> int | None:
        if self.end_at is not None and due > self.end_at:
            return None
        return due


_MISSING = object()
_FIELD_NAMES = tuple(f.name for f in fields(Job))
_FIELD_SET = frozenset(_FIELD_NAMES)
# 10000-01-01T00:00:00Z: later times cannot be shown as ISO 8601 (export, show).
_MAX_EPOCH_S = 253_402_300_800
_FIELD_DEFAULTS: dict[str, Any] = {
    f.name: (f.default_factory() if callable(f.default_factory) else f.default)
    for f in fields(Job)
}


# ---------------------------------------------------------------------- parsing
def _parse(data: Mapping[str, Any], defaults: Defaults) -> Job:
    if not isinstance(data, Mapping):
        raise ValidationError("row", data, "must be a JSON object")
    for key in data:
        if key not in _FIELD_SET:
            raise ValidationError(_field_name(key), data[key], "unknown field")
    values: dict[str, Any] = {k: v for k, v in data.items() if v is not None and v != ""}

    url = values.get("url")
    if url is not None:
        url = _url(url)
    tz_name = _timezone(values.get("timezone", defaults.timezone))
    tz = ZoneInfo(tz_name)

    job_id, task = _identity(values, url, defaults)
    day_rule = _day_rule(values)
    interval, cron = _timing(values, defaults, day_rule)
    times = {name: _time(values, name, tz) for name in _TIME_FIELDS}
    if times["start_at"] and times["end_at"] and times["end_at"] <= times["start_at"]:
        raise ValidationError("end_at", values["end_at"], "must be after start_at")

    job = Job(
        id=job_id, task=task, interval_s=interval, cron=cron, timezone=tz_name,
        day_rule=day_rule if cron else "or",
        run_at=times["run_at"], name=_text(values, "name"), url=url,
        meta=_container(values, "meta", dict), args=_container(values, "args", list),
        kwargs=_container(values, "kwargs", dict),
        jitter_s=_number(values, "jitter_s", minimum=0.0),
        queue=_opt_text(values, "queue"), routing_key=_opt_text(values, "routing_key"),
        priority=_integer(values, "priority", 0, 255),
        expires_s=_number(values, "expires_s", minimum=0.001),
        enabled=_bool(values, "enabled"), start_at=times["start_at"], end_at=times["end_at"],
        max_runs=_integer(values, "max_runs", 1, None),
        misfire_grace_s=_number(values, "misfire_grace_s", minimum=0.0),
        retry_max=_integer(values, "retry_max", 0, 1000),
        retry_base_s=_number(values, "retry_base_s", minimum=0.001),
        domain=_domain(values),
        transport=_transport(values),
    )
    _check_serialisable(job)
    return job


def _transport(values: Mapping[str, Any]) -> str:
    raw = values.get("transport", "celery")
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in TRANSPORTS:
        raise ValidationError("transport", raw,
                              'must be "celery" (beat publishes it) or "http" (the job gateway)')
    return str(value)


def _domain(values: Mapping[str, Any]) -> str | None:
    value = values.get("domain")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError("domain", value, "must be a string")
    try:
        return normalise_domain(value)
    except ValueError as exc:
        raise ValidationError("domain", value, str(exc)) from None


def _field_name(key: Any) -> str:
    # str() of a key can raise (an int over 4300 digits) or be megabytes long;
    # an empty or unprintable one (a newline, a lone surrogate) is quoted.
    if isinstance(key, str) and key.isprintable() and key.strip():
        return key[:100]
    return show_value(key)


def _identity(values: Mapping[str, Any], url: str | None,
              defaults: Defaults) -> tuple[str, str]:
    job_id = values.get("id")
    if job_id is None:
        if url is None:
            raise ValidationError("id", None, "a job without a url needs an explicit id")
        job_id = job_id_for_url(url)
    problem = id_problem(job_id)
    if problem:
        raise ValidationError("id", job_id, problem)
    task = values.get("task", defaults.task if url is not None else None)
    if not isinstance(task, str) or not task.strip():
        raise ValidationError("task", task, "a job without a url needs a task name")
    problem = _text_problem(task.strip(), _MAX_LEN["task"])
    if problem:
        raise ValidationError("task", task, problem)
    return job_id, task.strip()


def _day_rule(values: Mapping[str, Any]) -> str:
    raw = values.get("day_rule", "or")
    rule = raw.strip().lower() if isinstance(raw, str) else raw
    if rule not in DAY_RULES:
        raise ValidationError("day_rule", raw,
                              'must be "or" (crontab(5)) or "and" (Celery crontab)')
    return str(rule)


def _timing(values: Mapping[str, Any], defaults: Defaults,
            day_rule: str = "or") -> tuple[float | None, str | None]:
    timing = [k for k in ("interval_s", "cron", "run_at") if k in values]
    if len(timing) > 1:
        raise ValidationError(timing[1], values[timing[1]],
                              f"give only one of interval_s, cron, run_at (also got {timing[0]})")
    if not timing:
        return defaults.interval_s, None
    if timing == ["interval_s"]:
        return _number(values, "interval_s", minimum=0.001), None
    if timing == ["run_at"]:
        return None, None
    cron = values["cron"]
    # The cheap checks first: croniter's parse of a 100 KB string takes a second.
    problem = ("must be a string" if not isinstance(cron, str)
               else f"must be at most {_MAX_LEN['cron']} characters"
               if len(cron) > _MAX_LEN["cron"] else _cron_problem(cron.strip(), day_rule))
    if problem:
        raise ValidationError("cron", cron, problem)
    return None, " ".join(cron.split())


def _check_serialisable(job: Job) -> None:
    # The other fields are checked primitives: only the containers can fail to
    # serialise, and encoding just them is much cheaper than job.to_json().
    for name, value in (("meta", job.meta), ("args", job.args), ("kwargs", job.kwargs)):
        if value:
            problem = _json_problem(value)
            if problem:
                raise ValidationError(name, value, problem)


def _json_problem(value: Any) -> str | None:
    """Why a meta/args/kwargs value cannot be stored everywhere a job goes, or None.

    Redis, Celery messages, SQL JSON columns and exports all hold it, so it
    must be strict JSON: no NaN or Infinity, string keys, valid Unicode
    without NUL (PostgreSQL's jsonb refuses ``\\u0000``), bounded depth and size.
    """
    problem = _shape_problem(value)
    if problem:
        return problem
    try:
        text = _encode(value)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            return "must not contain NaN or Infinity (not JSON)"
        return f"must be JSON-serialisable: {exc}"  # e.g. an int over 4300 digits
    except TypeError as exc:
        return f"must be JSON-serialisable: {exc}"
    if len(text) > _MAX_JSON_CHARS:
        return f"must be at most {_MAX_JSON_CHARS:,} characters as JSON, not {len(text):,}"
    # ensure_ascii=False leaves surrogates as they are and escapes only NUL and
    # other control characters: an ASCII text without a \u0000 escape is clean.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        return "must not contain NUL characters"
    if not text.isascii() and _SURROGATE.search(text):
        return "must be valid Unicode (it holds a lone surrogate)"
    return None


def _shape_problem(value: Any) -> str | None:
    # Recursion stops at _MAX_DEPTH, so it never nears the interpreter's limit
    # (the values nested past that limit are the ones rejected here). The item
    # budget also bounds a structure that shares one list many times (its JSON
    # would be huge). Every item takes at least one character of JSON.
    return _walk(value, 1, [_MAX_JSON_CHARS])


def _walk(node: Any, depth: int, budget: list[int]) -> str | None:
    if depth > _MAX_DEPTH:
        return f"must be nested at most {_MAX_DEPTH} levels deep"
    budget[0] -= len(node)
    if budget[0] < 0:
        return f"must be at most {_MAX_JSON_CHARS:,} characters as JSON"
    if isinstance(node, dict):
        # map(isinstance, ...): the common flat meta {"site": "x"} stays in C.
        if not all(map(isinstance, node, _ALWAYS_STR)):
            return "must have only string keys (JSON object keys are strings)"
        node = node.values()
    if any(map(isinstance, node, _ALWAYS_CONTAINERS)):
        for item in node:
            if isinstance(item, _CONTAINERS):
                problem = _walk(item, depth + 1, budget)
                if problem:
                    return problem
    return None


_CONTAINERS = (dict, list, tuple)
# Second arguments of map(isinstance, items, ...): endless, so never used up.
_ALWAYS_STR = itertools.repeat(str)
_ALWAYS_CONTAINERS = itertools.repeat(_CONTAINERS)


# Strict JSON: NaN and Infinity raise instead of writing what no JSON parser
# (nor PostgreSQL's jsonb) reads back.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


# Cached: one bulk upsert asks for the same slot for every job that shares a
# cron expression and zone, and each answer costs about a millisecond.
@functools.lru_cache(maxsize=4096)
def _cron_slot_after(expr: str, tz: str, ms: int, day_rule: str = "or") -> int:
    return dt_to_ms(cron_next(expr, ZoneInfo(tz), ms_to_dt(ms), day_rule))


# Cached: a fleet shares a handful of cron expressions, and croniter is the
# dearest step of parsing a cron row.
@functools.lru_cache(maxsize=4096)
def _cron_problem(expr: str, day_rule: str = "or") -> str | None:
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


# ------------------------------------------------------------- field checks
# Limits that keep every accepted job storable everywhere it goes: Redis, a
# Celery message, the Django model (its max_length and integer columns), an
# export, and a message that quotes it.
#: Longest text of each field: the Django model's max_length.
_MAX_LEN = {"name": 200, "task": 200, "queue": 200, "routing_key": 200, "url": 2000,
            "cron": 120, "timezone": 64}
#: Longest duration (interval, jitter, expiry, grace, retry base): 100 years,
#: so now + interval + jitter is always a due time before year 10000.
_MAX_SECONDS = 3_155_760_000
#: Largest ``max_runs``: what a SQL integer column (PositiveIntegerField) holds.
_MAX_INT = 2**31 - 1
#: Deepest meta/args/kwargs, and their largest JSON encoding.
_MAX_DEPTH = 32
_MAX_JSON_CHARS = 1 << 20
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A \u0000 escape in JSON text (its backslash not itself escaped).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_URL_SPACE = re.compile(r"[\s\x00-\x1f\x7f]")
# A netloc with a user, a port or an IPv6 host: the ones urlsplit parses further.
_URL_HOST_EXTRAS = re.compile(r"[@:\[\]]")


def _text_problem(value: str, limit: int | None) -> str | None:
    """Why a text cannot be stored (too long, NUL, lone surrogate), or None."""
    if not value:
        return None
    if limit is not None and len(value) > limit:
        return f"must be at most {limit} characters, not {len(value):,}"
    if value.isascii():  # the common case, and a cheap test
        return "must not contain NUL characters" if "\x00" in value else None
    found = _BAD_CHAR.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters"
    # Surrogates cannot be encoded as UTF-8: Redis, SQL and the broker would refuse them.
    return "must be valid Unicode (it holds a lone surrogate)"


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise ValidationError("url", value, "must be a string")
    url = value.strip()
    problem = _text_problem(url, _MAX_LEN["url"])
    if problem:
        raise ValidationError("url", value, problem)
    # urlsplit silently drops tabs and newlines, so look for them first.
    if _URL_SPACE.search(url):
        raise ValidationError("url", value, "must not contain spaces or control characters")
    try:
        parts = urlsplit(url)  # ValueError: "Invalid IPv6 URL" for http://[::1
        host = parts.netloc
        # Only a netloc with a user, a port or an IPv6 host needs parsing further
        # (a plain "example.com" is the common case, and cheap).
        if _URL_HOST_EXTRAS.search(host):
            parts.port  # noqa: B018  -- raises ValueError for a port out of 0-65535
            host = parts.hostname or ""
    except ValueError as exc:
        raise ValidationError("url", value, f"must be an absolute http(s) URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ValidationError("url", value, "must be an absolute http(s) URL")
    return url


def _timezone(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError("timezone", value, "must be an IANA time zone name")
    if _text_problem(value, _MAX_LEN["timezone"]):
        raise ValidationError("timezone", value, "unknown IANA time zone")
    try:
        ZoneInfo(value)
    # OSError: a folder of the zone database ("Europe" -> IsADirectoryError),
    # or a name the file system refuses.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValidationError("timezone", value, "unknown IANA time zone") from exc
    return value


def _number(values: Mapping[str, Any], name: str, minimum: float) -> float | None:
    """A duration in seconds, finite, from ``minimum`` to 100 years."""
    raw = values.get(name)
    if raw is None:
        return None
    try:
        if isinstance(raw, bool):
            raise TypeError
        number = float(raw)
    # OverflowError: an int past any float (10**400, valid JSON).
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(name, raw, "must be a number") from exc
    if not math.isfinite(number) or number < minimum:
        raise ValidationError(name, raw, f"must be a finite number >= {minimum:g}")
    if number > _MAX_SECONDS:
        raise ValidationError(name, raw, f"must be at most {_MAX_SECONDS:,} (100 years)")
    return number


def _integer(values: Mapping[str, Any], name: str, low: int, high: int | None) -> int | None:
    """An integer from ``low`` to ``high`` (``None``: the largest a SQL integer column holds)."""
    raw = values.get(name)
    if raw is None:
        return None
    high = _MAX_INT if high is None else high
    number: int | None = None
    if isinstance(raw, bool):
        pass
    # is_integer() is False for NaN and the infinities.
    elif isinstance(raw, numbers.Integral) or (isinstance(raw, float) and raw.is_integer()):
        number = int(raw)
    elif isinstance(raw, str):
        # int() of over 4300 digits raises ValueError too; a bound is all we need.
        with contextlib.suppress(ValueError):
            number = int(raw)
    if number is None:
        raise ValidationError(name, raw, "must be an integer")
    if not low <= number <= high:
        raise ValidationError(name, raw, f"must be between {low} and {high}")
    return number


def _bool(values: Mapping[str, Any], name: str) -> bool:
    raw = values.get(name, True)
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValidationError(name, raw, "must be true or false")


def _text(values: Mapping[str, Any], name: str) -> str:
    raw = values.get(name, "")
    if not isinstance(raw, str):
        raise ValidationError(name, raw, "must be a string")
    problem = _text_problem(raw, _MAX_LEN.get(name))
    if problem:
        raise ValidationError(name, raw, problem)
    return raw


def _opt_text(values: Mapping[str, Any], name: str) -> str | None:
    return _text(values, name) or None


def _container(values: Mapping[str, Any], name: str, kind: type) -> Any:
    raw = values.get(name, kind())
    if isinstance(raw, str):  # a CSV cell or a form field holding JSON
        if len(raw) > _MAX_JSON_CHARS:
            raise ValidationError(name, raw, f"must be at most {_MAX_JSON_CHARS:,} characters "
                                             "as JSON")
        try:
            raw = json.loads(raw)
        except RecursionError as exc:  # json recurses once per level of nesting
            raise ValidationError(name, raw, f"must be nested at most {_MAX_DEPTH} levels "
                                             "deep") from exc
        except ValueError as exc:  # malformed, or an int over 4300 digits
            raise ValidationError(name, raw, f"must be a JSON {kind.__name__}") from exc
    if not isinstance(raw, kind):
        raise ValidationError(name, raw, f"must be a {'list' if kind is list else 'JSON object'}")
    return raw


def _time(values: Mapping[str, Any], name: str, tz: ZoneInfo) -> int | None:
    """An ISO 8601 string (naive = the job's zone) or epoch seconds, as epoch ms."""
    raw = values.get(name)
    if raw is None:
        return None
    if isinstance(raw, datetime):
        dt = raw
    elif isinstance(raw, int | float) and not isinstance(raw, bool):
        # A chained comparison, not float(): it is exact for 10**400 and false for NaN.
        if not 0 <= raw < _MAX_EPOCH_S:
            raise ValidationError(name, raw, "must be a non-negative epoch time before year 10000")
        return int(raw * 1000)
    elif isinstance(raw, str):
        try:
            dt = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValidationError(name, raw, "must be an ISO 8601 date-time") from exc
    else:
        raise ValidationError(name, raw, "must be an ISO 8601 date-time or epoch seconds")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    try:
        ms = dt_to_ms(dt.astimezone(UTC))
    # OverflowError: 9999-12-31T23:00-05:00 is past datetime.max in UTC (and
    # 0001-01-01T00:00+01:00 before datetime.min); ValueError, TypeError: a
    # foreign tzinfo with a bad utcoffset().
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValidationError(name, raw, _TIME_RANGE) from exc
    # The same range as epoch seconds: before 1970 a due time is negative, which
    # exports and the Django admin do not expect.
    if not 0 <= ms < _MAX_EPOCH_S * 1000:
        raise ValidationError(name, raw, _TIME_RANGE)
    return ms


_TIME_RANGE = "must be from 1970-01-01 to 9999-12-31 (UTC)"
