"""``add``, ``list``, ``show``, ``stats``, and the controls ``delete``, ``pause``,
``resume`` and ``run-now``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import (
    EX_DATAERR,
    EX_NOT_FOUND,
    MAX_LISTED,
    NOTE,
    defaults_of,
    echo,
    fail,
    handles_errors,
    iso,
    option,
    option_of,
    store_of,
    user_words,
    with_options,
)
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import (
    JobNotFound,
    ValidationError,
    got,
)
from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import summary as recrawl_summary
from celery_zsched.core.rows import export_row
from celery_zsched.store import JobInfo, Store


# --------------------------------------------------------------------- add
def _pairs(option: str, values: Iterable[str], as_json: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        out[key] = _maybe_json(value, "kwargs") if as_json else value
    return out


def _maybe_json(value: str, field: str) -> Any:
    try:
        return json.loads(value)
    except RecursionError as exc:  # nested past what json can read
        raise ValidationError(field, value, "must be nested at most 32 levels deep") from exc
    except ValueError:
        return value


def _time_arg(value: str | None) -> str | float | None:
    """Epoch seconds stay numbers; anything else is parsed as ISO 8601 by the job."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return value


_ADD_OPTIONS = [
    option("--url", group="Target", help="URL to fetch; the id defaults to sha1(url)[:12]."),
    option("--id", "job_id", group="Target", help="Explicit job id."),
    option("--task", group="Target", help="Celery task name (default: zsched_default_task)."),
    option("--name", group="Target", help="Free-text label."),
    option("--meta", multiple=True, metavar="KEY=VALUE", group="Target",
            help="Metadata passed to a URL task (string values; repeatable)."),
    option("--kwarg", multiple=True, metavar="KEY=VALUE", group="Target",
            help="Task keyword argument, JSON when it parses as JSON (repeatable)."),
    option("--arg", multiple=True, group="Target",
            help="Task positional argument, JSON when it parses as JSON (repeatable)."),
    option("--interval", type=float, group="Timing", help="Run every this many seconds."),
    option("--cron", group="Timing", help="5-field cron expression, in --tz."),
    option("--day-rule", type=click.Choice(["or", "and"], case_sensitive=False),
            group="Timing",
            help="How --cron's day-of-month and day-of-week combine: or (crontab(5), "
                 "the default) or and (Celery's crontab: both must match)."),
    option("--tz", group="Timing", help="IANA time zone (default: the app's timezone)."),
    option("--run-at", group="Timing",
            help="Run once at this ISO 8601 time (naive = --tz) or epoch seconds."),
    option("--jitter", type=float, group="Timing", help="Random delay of up to this many s."),
    option("--start-at", group="Timing", help="Do not run before this time."),
    option("--end-at", group="Timing", help="Do not run after this time."),
    option("--max-runs", type=int, group="Timing", help="Stop after this many runs."),
    option("--misfire-grace", type=float, group="Timing",
            help="Skip a fire that is later than this many seconds."),
    option("--paused", is_flag=True, group="Timing", help="Store the job paused."),
    option("--recrawl", type=click.Choice(["fixed", "adaptive"], case_sensitive=False),
            group="Recrawl",
            help="fixed (every --interval, the default) or adaptive: the interval follows "
                 "the page's estimated change rate (see the Recrawl policy page)."),
    option("--min-interval", type=float, group="Recrawl",
            help="Shortest adaptive interval in s (default: a tenth of --interval)."),
    option("--max-interval", type=float, group="Recrawl",
            help="Longest adaptive interval in s (default: ten times --interval)."),
    option("--freshness-target", type=float, group="Recrawl",
            help="Share of time (0-1) the copy should be fresh "
                 "(default: zsched_freshness_target)."),
    option("--queue", group="Routing",
            help="Celery queue (for --transport http: what GET /jobs/next?queue= selects)."),
    option("--transport", type=click.Choice(["celery", "http"], case_sensitive=False),
            group="Routing",
            help="Who runs it: celery (beat publishes it, the default) or http (workers in "
                 "any language take it from the job gateway, zsched serve)."),
    option("--routing-key", group="Routing", help="Routing key."),
    option("--priority", type=int, group="Routing", help="Message priority (0-255)."),
    option("--expires", type=float, group="Routing",
            help="Seconds after its due time that a message expires."),
    option("--domain", group="Routing",
            help="Pace the job under this domain instead of its URL's host."),
    option("--retry-max", type=int, group="Retries",
            help="Retries after an error before the next regular run "
                 "(default: zsched_retry_max)."),
    option("--retry-base", type=float, group="Retries",
            help="First retry delay in seconds, doubled per retry "
                 "(default: zsched_retry_base_s)."),
    option("--note", default="", group="Audit",
            help="Why: recorded with the change (zsched history ID shows it)."),
]


def _definition(opts: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": opts["job_id"], "url": opts["url"], "task": opts["task"], "name": opts["name"],
        "interval_s": opts["interval"], "cron": opts["cron"], "timezone": opts["tz"],
        "day_rule": opts["day_rule"],
        "run_at": _time_arg(opts["run_at"]), "start_at": _time_arg(opts["start_at"]),
        "end_at": _time_arg(opts["end_at"]), "jitter_s": opts["jitter"],
        "max_runs": opts["max_runs"], "misfire_grace_s": opts["misfire_grace"],
        "queue": opts["queue"], "routing_key": opts["routing_key"],
        "priority": opts["priority"], "expires_s": opts["expires"], "domain": opts["domain"],
        "retry_max": opts["retry_max"], "retry_base_s": opts["retry_base"],
        "transport": opts["transport"], "recrawl": opts["recrawl"],
        "min_interval_s": opts["min_interval"], "max_interval_s": opts["max_interval"],
        "freshness_target": opts["freshness_target"],
        "meta": _pairs("--meta", opts["meta"], as_json=False),
        "kwargs": _pairs("--kwarg", opts["kwarg"], as_json=True),
        "args": [_maybe_json(value, "args") for value in opts["arg"]],
        "enabled": not opts["paused"],
    }
    return {k: v for k, v in data.items() if v is not None}


@click.command(cls=CeleryCommand)
@with_options(_ADD_OPTIONS)
@click.pass_context
@handles_errors
def add(ctx: click.Context, /, **opts: Any) -> None:
    """Add a job, or update the job with the same id; print its id and next run."""
    store = store_of(ctx)
    try:
        job = Job.from_dict(_definition(opts), defaults_of(ctx, store))
    except ValidationError as exc:
        fail(f"invalid {option_of(exc.field)}: {user_words(exc.message)}{got(exc.value)}",
              EX_DATAERR)
    report = store.upsert(job, by=Actor.cli(), note=opts["note"] or "")
    info = store.get(job.id)
    echo(ctx, job.id)
    verb = "created" if report.created else "updated"
    echo(ctx, f"{verb} {job.kind} job; next run: {_next_run(info)}")


def _next_run(info: JobInfo) -> str:
    if info.due_ms is not None:
        return iso(info.due_ms) or ""
    if info.lease_until_ms is not None:
        return "in flight"
    return "paused" if info.paused else info.status


# -------------------------------------------------------------------- reads
@click.command("list", cls=CeleryCommand)
@option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
         group="List Options", help="Rows to show.")
@option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
         group="List Options", help="Rows to skip.")
@click.pass_context
@handles_errors
def list_(ctx: click.Context, limit: int, offset: int) -> None:
    """Scheduled jobs, soonest first (paused and in-flight jobs are not scheduled)."""
    infos = store_of(ctx).list_jobs(offset=offset, limit=limit)
    rows = [("ID", "KIND", "NEXT RUN", "STATUS", "TARGET")]
    rows += [(i.job.id, i.job.kind, iso(i.due_ms) or "-", i.status, i.job.url or i.job.task)
             for i in infos]
    widths = [max(len(row[col]) for row in rows) for col in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        echo(ctx, "  ".join([*cells, row[4]]))


@click.command(cls=CeleryCommand)
@click.argument("job_id", metavar="ID")
@click.pass_context
@handles_errors
def show(ctx: click.Context, job_id: str) -> None:
    """A job's definition and live state, as JSON."""
    store = store_of(ctx)
    info = store.get(job_id)
    state = {k: v for k, v in info.state.to_dict().items() if v is not None}
    out = {
        "id": info.job.id, "kind": info.job.kind, "status": info.status,
        "paused": info.paused, "next_run": iso(info.due_ms),
        "lease_until": iso(info.lease_until_ms), "definition": export_row(info.job),
        "state": state,
    }
    if info.job.kind == "interval":
        out["recrawl"] = recrawl_summary(info.job, info.state, store.now_ms())
    echo(ctx, json.dumps(out, indent=2, ensure_ascii=False))


@click.command(cls=CeleryCommand)
@option("--json", "as_json", is_flag=True, group="Output Options", help="Print JSON.")
@click.pass_context
@handles_errors
def stats(ctx: click.Context, as_json: bool) -> None:
    """Job counts by state, jobs due soon, lifetime counters, backpressure per queue, and
    domains in trouble."""
    store = store_of(ctx)
    counts = store.stats()
    queues = store.queue_backpressure()
    # Which domains are slow or cut off, by name: the counts alone do not say
    # where to look (only with pacing on: off, no domain is paced).
    alerts = store.domain_alerts() if store.settings.pacing else {}
    if as_json:
        echo(ctx, json.dumps({**counts, "queues": queues,
                              **({"domain_alerts": alerts} if alerts else {})},
                              indent=2, sort_keys=True))
        return
    width = max(map(len, counts))
    for key, value in counts.items():
        echo(ctx, f"{key.ljust(width)}  {value}")
    bound = store.settings.queue_bound
    for queue, row in queues.items():
        # Which queue is full, by name: a worker pool that is down shows here.
        echo(ctx, f"queue {queue or '(none)'}: {row['in_flight']}/{bound} in flight, "
                  f"{row['held_back']} held back")
    for label, names in (("throttled domains", alerts.get("throttled", [])),
                         ("breakers open", alerts.get("breakers_open", []))):
        if names:
            more = len(names) - MAX_LISTED
            listed = ", ".join(names[:MAX_LISTED]) + (f" ... and {more} more" if more > 0 else "")
            echo(ctx, f"{label}: {listed}")


# ------------------------------------------------------------------ control
def _existing(store: Store, ids: tuple[str, ...]) -> None:
    missing = [i for i, info in zip(ids, store.get_many(ids), strict=True) if info is None]
    if len(missing) == 1 and len(ids) == 1:
        raise JobNotFound(missing[0])
    if missing:
        fail(f"no such job(s): {', '.join(missing)}; nothing changed", EX_NOT_FOUND)


def _report(ctx: click.Context, ids: tuple[str, ...], changed: int, one: str, same: str,
            many: str) -> None:
    # Templates: ``one``/``same`` take {id} (changed or not), ``many`` {changed} and {total}.
    if len(ids) > 1:
        echo(ctx, many.format(changed=changed, total=len(ids)))
    else:
        echo(ctx, (one if changed else same).format(id=ids[0]))


_IDS = click.argument("ids", metavar="ID...", nargs=-1, required=True)
#: Why: kept with the change in the audit trail (``zsched history ID``). Typed:
#: cli_dead imports it inside an import cycle, where mypy cannot infer it.


@click.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@handles_errors
def delete(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Delete jobs; a run in flight finishes but does not bring them back."""
    store = store_of(ctx)
    _existing(store, ids)
    changed = store.delete(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "deleted {id}", "{id}: not deleted",
            "deleted {changed} of {total} job(s)")


@click.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@handles_errors
def pause(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Pause jobs; a run in flight finishes but is not rescheduled."""
    store = store_of(ctx)
    _existing(store, ids)
    changed = store.pause(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "paused {id}", "{id}: already paused",
            "paused {changed} of {total} job(s)")


@click.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@handles_errors
def resume(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Resume paused or dead-lettered jobs at their next regular run from now."""
    store = store_of(ctx)
    _existing(store, ids)
    changed = store.resume(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "resumed {id}", "{id}: not paused",
            "resumed {changed} of {total} job(s)")
    if len(ids) == 1:
        echo(ctx, f"next run: {_next_run(store.get(ids[0]))}")


@click.command("run-now", cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@handles_errors
def run_now(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Make jobs due now (a job in flight is left alone)."""
    store = store_of(ctx)
    _existing(store, ids)
    changed = store.run_now(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "{id} is due now", "{id}: in flight, left alone",
            "made {changed} of {total} job(s) due now")

