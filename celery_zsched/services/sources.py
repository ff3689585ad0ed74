"""Switching from another beat scheduler: read its entries as jobs that continue its timeline.

A source (redbeat here, django-celery-beat in :mod:`celery_zsched.contrib.django.dcb_source`)
is read into a :class:`SourceRead`: one :class:`SourceJob` per entry that can be
expressed, and one :class:`~celery_zsched.core.errors.ValidationError` per entry that
cannot (a solar or rrule schedule, bad JSON, an invalid cron). Each job keeps the
instant its source last ran it, so its first run in zsched is the one the source
would have made next (:func:`first_due_ms`), and it then follows zsched's rules.

Ids come from the entry name exactly as for static ``beat_schedule`` entries
(:func:`~celery_zsched.services.beat_entries.static_job_id`): an entry that is also in
``beat_schedule`` maps to the same job instead of a second one.

redbeat is imported lazily, so it stays an optional dependency.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_zsched.config import Settings
from celery_zsched.core.audit import Actor, local_user
from celery_zsched.core.errors import ConfigurationError, ImportValidationError, ValidationError
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services.beat_entries import cron_of_crontab, static_job_id
from celery_zsched.store import ImportReport, Store

#: Names accepted by ``--from``.
REDBEAT = "redbeat"
DJANGO_CELERY_BEAT = "django-celery-beat"
#: redbeat's default ``redbeat_key_prefix``.
REDBEAT_DEFAULT_PREFIX = "redbeat:"
#: Longest job name: the Django model's ``name`` column.
MAX_NAME = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Lines listed per category in a summary before "... and N more".
_MAX_LISTED = 500
#: Entries read from redbeat per round trip.
_READ_CHUNK = 1000
#: Celery routing options a job keeps (``expires`` is handled on its own).
_KEPT_OPTIONS = ("queue", "routing_key", "priority")


@dataclass(frozen=True)
class SourceJob:
    """One source entry as a job.

    ``after_ms`` is the instant the source computes the entry's next run from
    (its last run; for an entry that never ran, whatever the source uses
    instead). ``0`` means "as soon as allowed". ``lost`` lists what the job
    does not carry over, e.g. ``"exchange='fanout'"``.
    """

    source_name: str
    job: Job
    after_ms: int
    lost: tuple[str, ...] = ()


@dataclass
class SourceRead:
    """What a source reader found: the jobs, and the entries that cannot be moved."""

    source: str
    jobs: list[SourceJob] = field(default_factory=list)
    errors: list[ValidationError] = field(default_factory=list)

    @property
    def entries(self) -> int:
        """Entries read, valid or not."""
        return len(self.jobs) + len(self.errors)


def entry_error(label: str, exc: ValidationError) -> ValidationError:
    """``exc`` attributed to a source entry, e.g. ``PeriodicTask 'nightly': cron: ...``."""
    return ValidationError(f"{label}: {exc.field}", exc.value, exc.message, exc.row)


def collect(source: str, items: Iterable[tuple[str, Callable[[], SourceJob]]]) -> SourceRead:
    """Build every entry (label, builder); a :class:`ValidationError` becomes a row error.

    A second entry mapping to an id already taken is an error too: the ids are
    derived from names, so this only happens for hand-made names like ``beat-<sha1>``.
    """
    read = SourceRead(source)
    seen: dict[str, str] = {}
    for label, build in items:
        try:
            item = build()
        except ValidationError as exc:
            read.errors.append(entry_error(label, exc))
            continue
        first = seen.setdefault(item.job.id, label)
        if first != label:
            read.errors.append(ValidationError(f"{label}: id", item.job.id,
                                               f"same job id as {first}"))
            continue
        read.jobs.append(item)
    return read


def job_name(*candidates: str | None) -> str:
    """The first non-blank candidate on one line, cut to :data:`MAX_NAME` characters."""
    for text in candidates:
        line = " ".join((text or "").split())
        if line:
            return line if len(line) <= MAX_NAME else line[:MAX_NAME - 1] + "…"
    return ""


def source_job(name: str, data: dict[str, Any], defaults: Defaults, after: datetime | None,
               lost: Sequence[str] = ()) -> SourceJob:
    """Validate ``data`` (``id`` from ``name``) into a :class:`SourceJob`."""
    for key in ("start_at", "run_at"):
        if isinstance(data.get(key), datetime):
            # Up to the next whole ms: a job stores ms and must not run early.
            data = {**data, key: ms_to_dt(ceil_ms(data[key]))}
    job = Job.from_dict({"id": static_job_id(name), **data}, defaults)
    return SourceJob(name, job, 0 if after is None else ceil_ms(after), tuple(lost))


def ceil_ms(dt: datetime) -> int:
    """Epoch ms of an aware datetime, rounded up (a moved job must never run early)."""
    return -(-(dt - _EPOCH) // timedelta(milliseconds=1))


# ---------------------------------------------------------------- schedules
def crontab_timing(sched: Any, timezone: str) -> dict[str, Any]:
    """Job fields of a Celery ``crontab`` that fires in ``timezone``.

    The cron is written from the sets Celery parsed, so Celery-only spellings
    (``day_of_week="sunday"``) mean what they meant. Celery matches a day when
    it is in ``day_of_month`` AND in ``day_of_week`` (cron(5) takes either when
    both are restricted), so the job says so.
    """
    return {"cron": cron_of_crontab(sched), "timezone": timezone, "day_rule": "and"}


def interval_timing(every: timedelta) -> dict[str, Any]:
    """Job fields of an interval."""
    return {"interval_s": every.total_seconds()}


def first_due_ms(item: SourceJob, now_ms: int, settings: Settings,
                 rng: random.Random) -> int | None:
    """The first run of a moved job: the source's next run after ``item.after_ms``.

    That run, if it is already past (the source was stopped through it), is
    ``now``: the job catches up once, as zsched's own jobs do. ``None``: the job
    never runs again (its end is past).
    """
    job = item.job
    if job.kind == "once":
        assert job.run_at is not None
        due: int | None = max(job.run_at, job.start_at or 0)
    else:
        # The run after a completion at after_ms: interval = after + every,
        # cron = the next slot; both honour start_at, end_at and jitter.
        due = job.next_regular_ms(item.after_ms, settings, rng)
    if due is None:
        return None
    due = max(due, now_ms)
    return None if job.end_at is not None and due > job.end_at else due


# ------------------------------------------------------------------ redbeat
def _redbeat_entry_cls() -> Any:
    try:
        from redbeat.schedulers import RedBeatSchedulerEntry
    except ImportError as exc:
        raise ConfigurationError(
            "reading redbeat's entries needs redbeat: pip install celery-redbeat") from exc
    return RedBeatSchedulerEntry


def _redbeat_timing(sched: Any, timezone: str) -> tuple[dict[str, Any], list[str]]:
    from celery.schedules import crontab, schedule

    if isinstance(sched, crontab):
        return crontab_timing(sched, timezone), []
    if type(sched) is schedule:
        lost = ["schedule.relative=True (runs at last run + every, not rounded)"] \
            if sched.relative else []
        every: timedelta = sched.run_every  # type: ignore[attr-defined]
        return interval_timing(every), lost
    kind = sched.get("__type__", "unknown") if isinstance(sched, dict) else type(sched).__name__
    raise ValidationError("schedule", kind,
                          "only interval and crontab schedules can be moved to zsched")


def _redbeat_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    data = {key: options[key] for key in _KEPT_OPTIONS if options.get(key) is not None}
    expires = options.get("expires")
    if isinstance(expires, datetime):
        data["end_at"] = expires  # an absolute expiry ends the schedule
    elif expires is not None:
        data["expires_s"] = expires
    lost = [f"options.{key}={value!r}" for key, value in sorted(options.items())
            if key not in (*_KEPT_OPTIONS, "expires") and value not in (None, {}, "")]
    return data, lost


def redbeat_job(key: str, prefix: str, raw_definition: str | None, raw_meta: str | None,
                defaults: Defaults, timezone: str) -> SourceJob:
    """One redbeat entry (the ``definition`` and ``meta`` fields of hash ``key``) as a job."""
    entry_cls = _redbeat_entry_cls()
    if not raw_definition:
        raise ValidationError("definition", None, "the entry's hash has no definition")
    try:
        definition = entry_cls.decode_definition(raw_definition)
        meta = entry_cls.decode_meta(raw_meta)
    except (ValueError, TypeError) as exc:
        raise ValidationError("definition", raw_definition[:80],
                              f"is not redbeat JSON: {exc}") from exc
    name = str(definition.get("name") or key[len(prefix):])
    timing, lost = _redbeat_timing(definition.get("schedule"), timezone)
    options, lost_options = _redbeat_options(definition.get("options") or {})
    data = {"name": job_name(name), "task": definition.get("task"),
            "args": list(definition.get("args") or ()),
            "kwargs": dict(definition.get("kwargs") or {}),
            "enabled": bool(definition.get("enabled", True)), **timing, **options}
    if meta.get("total_run_count"):
        lost.append(f"total_run_count={meta['total_run_count']}")
    # redbeat runs an entry that never ran at once: after_ms 0 does the same.
    return source_job(name, data, defaults, meta.get("last_run_at"), [*lost, *lost_options])


def _redbeat_hashes(client: Any, prefix: str) -> Iterator[tuple[str, str | None, str | None]]:
    """(key, definition, meta) of every entry in redbeat's schedule, a chunk per round trip."""
    keys = [k.decode() if isinstance(k, bytes) else str(k)
            for k in client.zrange(prefix + ":schedule", 0, -1)]
    for start in range(0, len(keys), _READ_CHUNK):
        part = keys[start:start + _READ_CHUNK]
        pipe = client.pipeline(transaction=False)
        for key in part:
            pipe.hmget(key, "definition", "meta")
        for key, (definition, meta) in zip(part, pipe.execute(), strict=True):
            yield key, _text(definition), _text(meta)


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def read_redbeat(client: Any, defaults: Defaults, *, prefix: str = REDBEAT_DEFAULT_PREFIX,
                 timezone: str = "UTC") -> SourceRead:
    """Every entry of redbeat's schedule (``<prefix>:schedule``) on ``client``.

    ``timezone`` is the Celery app's: redbeat stores crontabs without one and
    fires them in the app's zone.
    """
    _redbeat_entry_cls()  # a missing redbeat is one clear error, not one per entry

    def builder(key: str, definition: str | None, meta: str | None
                ) -> Callable[[], SourceJob]:
        return lambda: redbeat_job(key, prefix, definition, meta, defaults, timezone)

    return collect(REDBEAT, ((f"redbeat entry {key!r}", builder(key, definition, meta))
                             for key, definition, meta in _redbeat_hashes(client, prefix)))


# ------------------------------------------------------------------- write
@dataclass
class SwitchPlan:
    """How a :class:`SourceRead` compares with what is stored, and what was written."""

    read: SourceRead
    dry_run: bool = False
    skip_invalid: bool = False
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: First run of each created or updated job (``None``: never runs again).
    first_due: dict[str, int | None] = field(default_factory=dict)
    redis: ImportReport | None = None
    #: Extra lines (the Django side adds its database counts).
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Human-readable summary: counts, each job with its first run, and what was lost."""
        verb = "would " if self.dry_run else ""
        by_id = {item.job.id: item for item in self.read.jobs}
        out = [f"{self.read.source}: {self.read.entries} entries, "
               f"{len(self.read.jobs)} movable, {len(self.read.errors)} not"]
        out += _capped([f"  error: {error}" for error in self.read.errors])
        if self.read.errors:
            out.append("  (left out: --skip-invalid)")
        out += [f"{verb}create: {len(self.created)}, {verb}update: {len(self.updated)}, "
                f"unchanged: {len(self.unchanged)}", *self.notes]
        out += _capped([f"  {verb}{word} {_describe(by_id[job_id], self.first_due)}"
                        for word, ids in (("create", self.created), ("update", self.updated))
                        for job_id in ids])
        lost = [f"  {item.source_name!r} ({item.job.id}): {note}"
                for item in self.read.jobs for note in item.lost]
        if lost:
            out += ["not carried over:", *_capped(lost)]
        if self.redis is not None:
            out.append(f"Redis: {self.redis.created} created, {self.redis.updated} updated, "
                       f"{self.redis.rescheduled} rescheduled")
        return out


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= _MAX_LISTED:
        return lines
    return [*lines[:_MAX_LISTED], f"  ... and {len(lines) - _MAX_LISTED} more"]


def _describe(item: SourceJob, first_due: Mapping[str, int | None]) -> str:
    job = item.job
    due = first_due.get(job.id)
    if not job.enabled:
        when = "paused"
    elif due is None:
        when = "never runs again (ended)"
    else:
        when = "first run " + ms_to_dt(due).isoformat(timespec="seconds").replace("+00:00", "Z")
    timing = (f"cron {job.cron!r} {job.timezone}" if job.kind == "cron"
              else f"every {job.interval_s:g}s" if job.kind == "interval" else "once")
    return f"{item.source_name!r} -> {job.id}: {job.task}, {timing}, {when}"


def check_errors(read: SourceRead, skip_invalid: bool) -> None:
    """Refuse the whole source when an entry cannot be moved (unless ``skip_invalid``)."""
    if read.errors and not skip_invalid:
        raise ImportValidationError(read.errors)


def plan_against_store(store: Store, read: SourceRead, plan: SwitchPlan) -> list[Job]:
    """Sort ``read``'s jobs into created / updated / unchanged against Redis; compute first runs.

    Returns the jobs Redis needs (new, or with a different definition).
    """
    now = store.now_ms()
    todo: list[Job] = []
    items = read.jobs
    for start in range(0, len(items), _READ_CHUNK):
        part = items[start:start + _READ_CHUNK]
        for item, info in zip(part, store.get_many([i.job.id for i in part]), strict=True):
            if info is not None and info.job == item.job:
                plan.unchanged.append(item.job.id)
                continue
            (plan.created if info is None else plan.updated).append(item.job.id)
            plan.first_due[item.job.id] = first_due_ms(item, now, store.settings, store.rng)
            todo.append(item.job)
    return todo


def switch_to_store(store: Store, read: SourceRead, *, dry_run: bool = False,
                    skip_invalid: bool = False) -> SwitchPlan:
    """Store ``read``'s jobs in Redis, each first due when its source would have run it next.

    Nothing is written if an entry is invalid (unless ``skip_invalid``) or
    with ``dry_run``. Jobs whose stored definition is already equal are left
    alone, so running it twice changes nothing. A job that exists keeps its
    schedule unless its timing changed (ZADD NX, as for any import).
    """
    check_errors(read, skip_invalid)
    plan = SwitchPlan(read, dry_run=dry_run, skip_invalid=skip_invalid)
    todo = plan_against_store(store, read, plan)
    if todo and not dry_run:
        plan.redis = store.upsert_many(todo, stagger=False, first_due=plan.first_due,
                                       by=source_actor(read))
    return plan


def source_actor(read: SourceRead) -> Actor:
    """The actor of an import from another scheduler: ``user@host:source``."""
    return Actor("import", f"{local_user()}:{read.source}")


def redbeat_client(url: str | None, store: Store) -> Any:
    """A client on ``url``, or the store's own when ``url`` is ``None``."""
    if url is None:
        return store.client
    import redis

    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5,
                                socket_timeout=30)

