"""Job definitions: deterministic ids, (de)serialisation, next due times.

A definition is validated by :mod:`celery_zsched.core.validation` (whole
definitions) and :mod:`celery_zsched.core.fields` (single fields).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from celery_zsched.core.domains import domain_of
from celery_zsched.core.errors import ValidationError
from celery_zsched.core.fields import (
    MAX_EPOCH_MS,
    TIME_FIELDS,
    TRANSPORTS,
    id_problem,
    job_id_for_url,
)
from celery_zsched.core.policy import Defaults, JobPolicy
from celery_zsched.core.timing import (
    backoff_s,
    cron_slot_after,
    jitter_ms,
    ms_to_dt,
)
from celery_zsched.core.validation import parse_fields

__all__ = ["TRANSPORTS", "Defaults", "Job", "definition_tag", "id_problem", "job_id_for_url"]


def definition_tag(stored: str | bytes) -> str:
    """The SHA-1 (hex) of a stored definition, as ``redis.sha1hex`` computes it: what a
    compare-and-set edit expects (:meth:`Store.upsert`) and the REST API's ETag."""
    raw = stored.encode("utf-8") if isinstance(stored, str) else stored
    return hashlib.sha1(raw).hexdigest()


@functools.lru_cache(maxsize=1024)
def _signature(spec: str) -> str:
    # Cached: a worker settles job after job, most of them on a handful of intervals.
    return hashlib.sha1(spec.encode()).hexdigest()[:10]


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
    #: ``fixed`` (every ``interval_s``) or ``adaptive``: the interval follows the
    #: page's estimated change rate, within [min_interval_s, max_interval_s], to
    #: meet ``freshness_target`` (see :mod:`celery_zsched.core.recrawl`).
    recrawl: str = "fixed"
    min_interval_s: float | None = None
    max_interval_s: float | None = None
    #: Expected share of time the copy is fresh (0..1); default: the setting.
    freshness_target: float | None = None

    # ------------------------------------------------------------------ build
    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], defaults: Defaults | None = None, row: int | None = None
    ) -> Job:
        """Validate a definition (an import row, a CLI call, a JSON value).

        Raises :class:`ValidationError` naming the field, the value and ``row``.
        """
        try:
            return cls(**parse_fields(data, defaults or Defaults(), _FIELD_SET))
        except ValidationError as exc:
            if row is None:
                raise
            raise exc.at_row(row) from None

    @classmethod
    def from_json(cls, raw: str | bytes) -> Job:
        """Load a definition stored by :meth:`to_json` (already validated)."""
        data = json.loads(raw)
        if "id" not in data or "task" not in data:
            return cls(**{k: v for k, v in data.items() if k in _FIELD_SET})  # raises
        # Filled in directly, past the frozen dataclass's __init__, which sets each of
        # its thirty fields through object.__setattr__: that was most of the parse a
        # worker's settle makes of every job whose definition is not in its cache.
        values = dict(_PLAIN_DEFAULTS)
        for name, factory in _FACTORIES:
            values[name] = factory()
        for key, value in data.items():
            if key in _FIELD_SET:
                values[key] = value
        job = object.__new__(cls)
        job.__dict__.update(values)
        return job

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
        for name in TIME_FIELDS:
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
        return _signature(spec)

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
        try:
            return cron_slot_after(self.cron, self.timezone, ms, self.day_rule)
        except (OverflowError, ValueError):
            # No slot before year 10000 (a start_at late in 9999): datetime ends
            # there, and _clamp ends the job.
            return MAX_EPOCH_MS

    def _clamp(self, due: int) -> int | None:
        # A run at or after year 10000 could not be shown nor exported: it ends the
        # job, as if end_at were there.
        if due >= MAX_EPOCH_MS or (self.end_at is not None and due > self.end_at):
            return None
        return due


_MISSING = object()
_FIELD_NAMES = tuple(f.name for f in fields(Job))
_FIELD_SET = frozenset(_FIELD_NAMES)
#: The fields' defaults, but those a factory makes afresh for each job (``_FACTORIES``).
_PLAIN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Job)
                                   if f.default is not MISSING}
_FACTORIES: tuple[tuple[str, Callable[[], Any]], ...] = tuple(
    (f.name, f.default_factory) for f in fields(Job) if f.default_factory is not MISSING)
#: Each field's default value (id and task have none), for what ``to_json`` leaves out.
_FIELD_DEFAULTS: dict[str, Any] = {**_PLAIN_DEFAULTS,
                                   **{name: factory() for name, factory in _FACTORIES}}

