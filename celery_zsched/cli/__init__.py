"""``celery -A proj zsched ...``: manage the job store from the command line.

Installed through the ``celery.commands`` entry point, so Celery's own ``-A``
picks the app, whose ``zsched_*`` settings pick the store.

Exit status: 0 success, 1 unknown job id, 2 bad usage, 65 invalid job or
import file (nothing written), 69 Redis unreachable, 75 repartition refused (beat
or workers still alive), 78 bad ``zsched_*`` setting.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TextIO, TypeVar, cast

import celery._state
import click
import redis
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options
from celery.exceptions import CeleryCommandException

from celery_zsched.config import Settings, redact_url
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import (
    ConfigurationError,
    ImportValidationError,
    JobNotFound,
    StoreUnavailable,
    ValidationError,
    got,
)
from celery_zsched.core.formats import FORMATS, detect_format, iter_rows
from celery_zsched.core.job import Defaults, Job
from celery_zsched.core.rows import export_row, import_actor, parse_rows, write_rows
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services.appstore import app_timezone, store_for_app
from celery_zsched.services.sources import (
    DJANGO_CELERY_BEAT,
    REDBEAT,
    REDBEAT_DEFAULT_PREFIX,
    read_redbeat,
    redbeat_client,
    switch_to_store,
)
from celery_zsched.store import JobInfo, Store
from celery_zsched.store.connection import redis_client
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys
from celery_zsched.store.repartition import RepartitionRefused, recorded_partitions
from celery_zsched.store.repartition import repartition as move_partitions

P = ParamSpec("P")
R = TypeVar("R")

EX_NOT_FOUND = 1
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_CONFIG = 78

_STORE_META = "celery_zsched.store"
_NOTED_META = "celery_zsched.default_app_noted"
#: Errors listed before "... and N more" when rows are skipped.
_MAX_LISTED = 50
# CLI option of each job field whose name differs from ``--field-name``.
_OPTION_OF = {
    "interval_s": "--interval", "timezone": "--tz", "jitter_s": "--jitter",
    "expires_s": "--expires", "misfire_grace_s": "--misfire-grace", "enabled": "--paused",
    "kwargs": "--kwarg", "args": "--arg", "retry_base_s": "--retry-base",
}

# A job field's name as a word of a message ("after start_at", "one of interval_s, cron").
_FIELD_WORD = re.compile(r"(?<![\w-])(interval_s|cron|run_at|start_at|end_at|timezone|jitter_s|"
                         r"expires_s|misfire_grace_s|max_runs|day_rule|retry_max|retry_base_s)"
                         r"(?![\w-])(?! expression)")


def _option_of(field: str) -> str:
    """The ``add`` option that sets job field ``field``: ``--misfire-grace``, ``--cron``."""
    return _OPTION_OF.get(field, "--" + field.replace("_", "-"))


def _user_words(message: str) -> str:
    """``message`` with the job fields it names written as the options that set them."""
    return _FIELD_WORD.sub(lambda m: _option_of(m.group(1)), message)


def _fail(message: str, code: int) -> NoReturn:
    raise CeleryCommandException(message=message, exit_code=code)


def _errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the package's errors into one-line messages and exit codes, never tracebacks."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ImportValidationError as exc:
            _fail(str(exc), EX_DATAERR)
        except ValidationError as exc:
            _fail(str(exc), EX_DATAERR)
        except JobNotFound as exc:
            _fail(str(exc), EX_NOT_FOUND)
        except ConfigurationError as exc:
            _fail(f"configuration: {exc}", EX_CONFIG)
        except StoreUnavailable as exc:
            _fail(f"cannot reach {_where()}: {exc.__cause__ or exc}", EX_UNAVAILABLE)
        except redis.RedisError as exc:
            _fail(f"{_where()} failed: {exc}", EX_UNAVAILABLE)
    return wrapper


def _where() -> str:
    ctx = click.get_current_context(silent=True)
    # ctx.meta is shared by the whole context chain; _store() records the store there.
    store = ctx.meta.get(_STORE_META) if ctx is not None else None
    if not isinstance(store, Store):
        return "Redis"
    return f"Redis at {redact_url(store.settings.redis_url)} (prefix {store.keys.prefix})"


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        _fail("run this as `celery -A proj zsched ...`, so there is a Celery app", EX_CONFIG)
    if _is_default_app(ctx, app) and not ctx.meta.get(_NOTED_META):
        ctx.meta[_NOTED_META] = True
        # Said before any Redis is touched: without -A the settings are Celery's
        # defaults, so the store is most likely not the one the user meant.
        click.echo("zsched: no -A/--app given: using Celery's default app and its settings "
                   f"({redact_url(Settings.from_app(app).redis_url)})", err=True)
    return app


def _is_default_app(ctx: click.Context, app: Any) -> bool:
    """``app`` is the fallback app Celery makes when no ``-A``/``--app`` names one."""
    root = ctx.find_root()
    return not root.params.get("app") and app is getattr(celery._state, "default_app", None)


def _store(ctx: click.Context) -> Store:
    store = store_for_app(_app(ctx))
    ctx.meta[_STORE_META] = store
    return store


def _defaults(ctx: click.Context, store: Store) -> Defaults:
    return Defaults.from_settings(store.settings, app_timezone(_app(ctx)))


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return ms_to_dt(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: What a terminal acts on rather than shows: C0 controls but newline and tab, DEL,
#: C1 controls (U+009B is CSI on its own), and the bidirectional and line-breaking
#: format characters that reorder or split what is shown.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029"
                              "\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with each character a terminal would act on written as its escape
    (``\\x1b``, ``\\u202e``); newlines and tabs are kept."""
    return _TERMINAL_UNSAFE.sub(
        lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _on_tty(err: bool = False) -> bool:
    """Whether the command's stdout (``err``: stderr) is a terminal."""
    stream: TextIO = sys.stderr if err else sys.stdout  # click's runner swaps these too
    return stream.isatty()


def _echo(ctx: click.Context, message: str) -> None:
    """Print a line of output. On a terminal, stored text (a worker's error, a note, a
    URL) cannot clear the screen, recolour it or retitle the window: its control
    characters are shown escaped. Piped or redirected output is left as it is."""
    if _on_tty():
        message = terminal_safe(message)
    obj = ctx.find_root().obj
    if obj is not None and hasattr(obj, "echo"):
        obj.echo(message)
    else:
        click.echo(message)


def _warn(message: str) -> None:
    """Print a line on stderr (progress, skipped rows), escaped as :func:`_echo` does."""
    click.echo(terminal_safe(message) if _on_tty(err=True) else message, err=True)


@click.group(name="zsched")
@click.pass_context
@handle_preload_options
def zsched(ctx: click.Context) -> None:
    """Manage celery-zsched jobs: add, import, export, list, pause, resume, run now;
    per-domain pacing (domains); and the dead-letter queue (dead)."""


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


def _option(*decls: str, group: str, **attrs: Any) -> Callable[[Callable[..., Any]], Any]:
    return click.option(*decls, cls=CeleryOption, help_group=group, **attrs)


_ADD_OPTIONS = [
    _option("--url", group="Target", help="URL to fetch; the id defaults to sha1(url)[:12]."),
    _option("--id", "job_id", group="Target", help="Explicit job id."),
    _option("--task", group="Target", help="Celery task name (default: zsched_default_task)."),
    _option("--name", group="Target", help="Free-text label."),
    _option("--meta", multiple=True, metavar="KEY=VALUE", group="Target",
            help="Metadata passed to a URL task (string values; repeatable)."),
    _option("--kwarg", multiple=True, metavar="KEY=VALUE", group="Target",
            help="Task keyword argument, JSON when it parses as JSON (repeatable)."),
    _option("--arg", multiple=True, group="Target",
            help="Task positional argument, JSON when it parses as JSON (repeatable)."),
    _option("--interval", type=float, group="Timing", help="Run every this many seconds."),
    _option("--cron", group="Timing", help="5-field cron expression, in --tz."),
    _option("--day-rule", type=click.Choice(["or", "and"], case_sensitive=False),
            group="Timing",
            help="How --cron's day-of-month and day-of-week combine: or (crontab(5), "
                 "the default) or and (Celery's crontab: both must match)."),
    _option("--tz", group="Timing", help="IANA time zone (default: the app's timezone)."),
    _option("--run-at", group="Timing",
            help="Run once at this ISO 8601 time (naive = --tz) or epoch seconds."),
    _option("--jitter", type=float, group="Timing", help="Random delay of up to this many s."),
    _option("--start-at", group="Timing", help="Do not run before this time."),
    _option("--end-at", group="Timing", help="Do not run after this time."),
    _option("--max-runs", type=int, group="Timing", help="Stop after this many runs."),
    _option("--misfire-grace", type=float, group="Timing",
            help="Skip a fire that is later than this many seconds."),
    _option("--paused", is_flag=True, group="Timing", help="Store the job paused."),
    _option("--queue", group="Routing",
            help="Celery queue (for --transport http: what GET /jobs/next?queue= selects)."),
    _option("--transport", type=click.Choice(["celery", "http"], case_sensitive=False),
            group="Routing",
            help="Who runs it: celery (beat publishes it, the default) or http (workers in "
                 "any language take it from the job gateway, zsched serve)."),
    _option("--routing-key", group="Routing", help="Routing key."),
    _option("--priority", type=int, group="Routing", help="Message priority (0-255)."),
    _option("--expires", type=float, group="Routing",
            help="Seconds after its due time that a message expires."),
    _option("--domain", group="Routing",
            help="Pace the job under this domain instead of its URL's host."),
    _option("--retry-max", type=int, group="Retries",
            help="Retries after an error before the next regular run "
                 "(default: zsched_retry_max)."),
    _option("--retry-base", type=float, group="Retries",
            help="First retry delay in seconds, doubled per retry "
                 "(default: zsched_retry_base_s)."),
    _option("--note", default="", group="Audit",
            help="Why: recorded with the change (zsched history ID shows it)."),
]


def _with_options(options: list[Callable[[Callable[..., Any]], Any]]
                  ) -> Callable[[Callable[..., Any]], Any]:
    def decorate(fn: Callable[..., Any]) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


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
        "transport": opts["transport"],
        "meta": _pairs("--meta", opts["meta"], as_json=False),
        "kwargs": _pairs("--kwarg", opts["kwarg"], as_json=True),
        "args": [_maybe_json(value, "args") for value in opts["arg"]],
        "enabled": not opts["paused"],
    }
    return {k: v for k, v in data.items() if v is not None}


@zsched.command(cls=CeleryCommand)
@_with_options(_ADD_OPTIONS)
@click.pass_context
@_errors
def add(ctx: click.Context, /, **opts: Any) -> None:
    """Add a job, or update the job with the same id; print its id and next run."""
    store = _store(ctx)
    try:
        job = Job.from_dict(_definition(opts), _defaults(ctx, store))
    except ValidationError as exc:
        _fail(f"invalid {_option_of(exc.field)}: {_user_words(exc.message)}{got(exc.value)}",
              EX_DATAERR)
    report = store.upsert(job, by=Actor.cli(), note=opts["note"] or "")
    info = store.get(job.id)
    _echo(ctx, job.id)
    verb = "created" if report.created else "updated"
    _echo(ctx, f"{verb} {job.kind} job; next run: {_next_run(info)}")


def _next_run(info: JobInfo) -> str:
    if info.due_ms is not None:
        return _iso(info.due_ms) or ""
    if info.lease_until_ms is not None:
        return "in flight"
    return "paused" if info.paused else info.status


# ------------------------------------------------------------ import/export
@contextlib.contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A callback taking the count done so far: a bar on a terminal, else a line per 10%."""
    if sys.stderr.isatty():
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            seen = [0]

            def advance(done: int) -> None:
                bar.update(done - seen[0])
                seen[0] = done
            yield advance
        return
    last = [-1, -1]  # the count and the tenth printed last

    def report(done: int) -> None:
        # A line per tenth, and one at the end: readable in CI logs, never a flood.
        tenth = done * 10 // max(total, 1)
        if done != last[0] and (tenth > last[1] or done >= total):
            percent = 100 * done // total if total else 100
            _warn(f"{label}: {done}/{total} ({percent}%)")
            last[0], last[1] = done, tenth
    yield report


@zsched.command("import", cls=CeleryCommand)
@_option("-f", "--file", "path", type=click.Path(dir_okay=False),
         group="Import Options", help="File of jobs (.json, .jsonl or .csv).")
@_option("--from", "source", type=click.Choice([REDBEAT, DJANGO_CELERY_BEAT]),
         group="Import Options",
         help="Move redbeat's entries instead of a file; each job's next run is the one "
              "redbeat would have made.")
@_option("--redbeat-prefix", group="Import Options",
         help="redbeat's key prefix (default: the app's redbeat_key_prefix, else 'redbeat:').")
@_option("--redbeat-url", group="Import Options",
         help="Redis URL of redbeat's keys (default: the zsched Redis).")
@_option("--format", "fmt", type=click.Choice(FORMATS), group="Import Options",
         help="File format (default: from the suffix).")
@_option("--skip-invalid", is_flag=True, group="Import Options",
         help="Store the valid rows and report the others (default: store nothing).")
@_option("--dry-run", is_flag=True, group="Import Options",
         help="Validate only; write nothing.")
@click.pass_context
@_errors
def import_(ctx: click.Context, path: str | None, fmt: str | None, skip_invalid: bool,
            dry_run: bool, source: str | None, redbeat_prefix: str | None,
            redbeat_url: str | None) -> None:
    """Import jobs from a file (staggered over each job's interval), or from redbeat.

    Every row is validated before anything is written. Re-importing a file
    updates definitions and leaves schedules where they are.
    """
    if source is not None and path is None:
        _import_from(ctx, source, redbeat_prefix, redbeat_url, dry_run, skip_invalid)
        return
    if path is None or source is not None:
        raise click.UsageError("give either --file or --from")
    store = _store(ctx)
    started = time.perf_counter()
    result = parse_rows(iter_rows(path, fmt), _defaults(ctx, store),
                        skip_invalid=skip_invalid)
    parsed_s = time.perf_counter() - started
    for error in result.errors[:_MAX_LISTED]:
        _warn(f"skipped {error}")
    if len(result.errors) > _MAX_LISTED:
        _warn(f"... and {len(result.errors) - _MAX_LISTED} more")
    count = len(result.jobs)
    if dry_run:
        _echo(ctx, f"dry run: {count} valid job(s), {len(result.errors)} invalid job(s) "
                   f"in {parsed_s:.2f}s; nothing written")
        return
    _warn(f"validated {count} job(s) in {parsed_s:.2f}s")
    with _progress(count, f"storing {path}") as progress:
        report = store.upsert_many(result.jobs, stagger=True, total=count, progress=progress,
                                   by=import_actor(path))
    skipped = f", skipped {len(result.errors)} invalid job(s)" if result.errors else ""
    _echo(ctx, f"imported {count} job(s): created {report.created}, updated {report.updated}, "
               f"rescheduled {report.rescheduled}{skipped} in "
               f"{time.perf_counter() - started:.2f}s")


def _import_from(ctx: click.Context, source: str, prefix: str | None, url: str | None,
                 dry_run: bool, skip_invalid: bool) -> None:
    if source == DJANGO_CELERY_BEAT:
        raise click.UsageError("django-celery-beat's tasks are read through Django: run "
                               "`python manage.py zsched_import --from django-celery-beat`")
    app, store = _app(ctx), _store(ctx)
    try:
        read = read_redbeat(redbeat_client(url, store), _defaults(ctx, store),
                            prefix=prefix or app.conf.get("redbeat_key_prefix") or
                            REDBEAT_DEFAULT_PREFIX, timezone=app_timezone(app))
    except redis.RedisError as exc:
        _fail(f"cannot read redbeat's entries: {exc}; nothing written", EX_UNAVAILABLE)
    for line in switch_to_store(store, read, dry_run=dry_run, skip_invalid=skip_invalid).lines():
        _echo(ctx, line)


@contextlib.contextmanager
def _output(path: str) -> Iterator[TextIO]:
    """stdout for ``-``; else a temporary file that replaces ``path`` only on success."""
    if path == "-":
        # An export is data, but one shown on a terminal is text to read: escaped too.
        yield cast("TextIO", _TerminalSafe(sys.stdout)) if _on_tty() else sys.stdout
        return
    target = Path(path)
    # click's atomic=True renames even after an error, so a failed export
    # would replace a good file with a truncated one.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with open(fd, "w", encoding="utf-8", newline="") as fp:
            yield fp
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _TerminalSafe:
    """What :func:`~celery_zsched.core.formats.write_rows` writes to: :func:`terminal_safe`
    text, to ``target``."""

    def __init__(self, target: TextIO) -> None:
        self._target = target

    def write(self, text: str) -> int:
        self._target.write(terminal_safe(text))
        return len(text)

    def flush(self) -> None:
        self._target.flush()


def _file_mode(path: Path) -> int:
    # mkstemp makes the file 0600; give it the mode open() would have.
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@zsched.command("export", cls=CeleryCommand)
@_option("-f", "--file", "path", default="-", type=click.Path(dir_okay=False, allow_dash=True),
         group="Export Options", help="Output file (default: stdout).")
@_option("--format", "fmt", type=click.Choice(FORMATS), group="Export Options",
         help="Output format (default: from the suffix, json on stdout).")
@click.pass_context
@_errors
def export(ctx: click.Context, path: str, fmt: str | None) -> None:
    """Write every job definition to a file that `zsched import` reads back."""
    if fmt is None:
        fmt = "json" if path == "-" else detect_format(path)
    store = _store(ctx)
    started = time.perf_counter()
    with _output(path) as fp:
        count = write_rows(store.iter_jobs(), fp, fmt)
    where = "stdout" if path == "-" else path
    _warn(f"exported {count} job(s) to {where} in {time.perf_counter() - started:.2f}s")


# -------------------------------------------------------------------- reads
@zsched.command("list", cls=CeleryCommand)
@_option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
         group="List Options", help="Rows to show.")
@_option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
         group="List Options", help="Rows to skip.")
@click.pass_context
@_errors
def list_(ctx: click.Context, limit: int, offset: int) -> None:
    """Scheduled jobs, soonest first (paused and in-flight jobs are not scheduled)."""
    infos = _store(ctx).list_jobs(offset=offset, limit=limit)
    rows = [("ID", "KIND", "NEXT RUN", "STATUS", "TARGET")]
    rows += [(i.job.id, i.job.kind, _iso(i.due_ms) or "-", i.status, i.job.url or i.job.task)
             for i in infos]
    widths = [max(len(row[col]) for row in rows) for col in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        _echo(ctx, "  ".join([*cells, row[4]]))


@zsched.command(cls=CeleryCommand)
@click.argument("job_id", metavar="ID")
@click.pass_context
@_errors
def show(ctx: click.Context, job_id: str) -> None:
    """A job's definition and live state, as JSON."""
    info = _store(ctx).get(job_id)
    state = {k: v for k, v in info.state.to_dict().items() if v is not None}
    _echo(ctx, json.dumps({
        "id": info.job.id, "kind": info.job.kind, "status": info.status,
        "paused": info.paused, "next_run": _iso(info.due_ms),
        "lease_until": _iso(info.lease_until_ms), "definition": export_row(info.job),
        "state": state,
    }, indent=2, ensure_ascii=False))


@zsched.command(cls=CeleryCommand)
@_option("--json", "as_json", is_flag=True, group="Output Options", help="Print JSON.")
@click.pass_context
@_errors
def stats(ctx: click.Context, as_json: bool) -> None:
    """Job counts by state, jobs due soon, lifetime counters, and domains in trouble."""
    store = _store(ctx)
    counts = store.stats()
    # Which domains are slow or cut off, by name: the counts alone do not say
    # where to look (only with pacing on: off, no domain is paced).
    alerts = store.domain_alerts() if store.settings.pacing else {}
    if as_json:
        _echo(ctx, json.dumps({**counts, **({"domain_alerts": alerts} if alerts else {})},
                              indent=2, sort_keys=True))
        return
    width = max(map(len, counts))
    for key, value in counts.items():
        _echo(ctx, f"{key.ljust(width)}  {value}")
    for label, names in (("throttled domains", alerts.get("throttled", [])),
                         ("breakers open", alerts.get("breakers_open", []))):
        if names:
            more = len(names) - _MAX_LISTED
            listed = ", ".join(names[:_MAX_LISTED]) + (f" ... and {more} more" if more > 0 else "")
            _echo(ctx, f"{label}: {listed}")


# ------------------------------------------------------------------ control
def _existing(store: Store, ids: tuple[str, ...]) -> None:
    missing = [i for i, info in zip(ids, store.get_many(ids), strict=True) if info is None]
    if len(missing) == 1 and len(ids) == 1:
        raise JobNotFound(missing[0])
    if missing:
        _fail(f"no such job(s): {', '.join(missing)}; nothing changed", EX_NOT_FOUND)


def _report(ctx: click.Context, ids: tuple[str, ...], changed: int, one: str, same: str,
            many: str) -> None:
    # Templates: ``one``/``same`` take {id} (changed or not), ``many`` {changed} and {total}.
    if len(ids) > 1:
        _echo(ctx, many.format(changed=changed, total=len(ids)))
    else:
        _echo(ctx, (one if changed else same).format(id=ids[0]))


_IDS = click.argument("ids", metavar="ID...", nargs=-1, required=True)
#: Why: kept with the change in the audit trail (``zsched history ID``). Typed:
#: cli_dead imports it inside an import cycle, where mypy cannot infer it.
NOTE: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--note", default="", metavar="TEXT",
    help="Why: recorded with the change (zsched history ID shows it).")


@zsched.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@_errors
def delete(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Delete jobs; a run in flight finishes but does not bring them back."""
    store = _store(ctx)
    _existing(store, ids)
    changed = store.delete(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "deleted {id}", "{id}: not deleted",
            "deleted {changed} of {total} job(s)")


@zsched.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@_errors
def pause(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Pause jobs; a run in flight finishes but is not rescheduled."""
    store = _store(ctx)
    _existing(store, ids)
    changed = store.pause(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "paused {id}", "{id}: already paused",
            "paused {changed} of {total} job(s)")


@zsched.command(cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@_errors
def resume(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Resume paused or dead-lettered jobs at their next regular run from now."""
    store = _store(ctx)
    _existing(store, ids)
    changed = store.resume(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "resumed {id}", "{id}: not paused",
            "resumed {changed} of {total} job(s)")
    if len(ids) == 1:
        _echo(ctx, f"next run: {_next_run(store.get(ids[0]))}")


@zsched.command("run-now", cls=CeleryCommand)
@_IDS
@NOTE
@click.pass_context
@_errors
def run_now(ctx: click.Context, ids: tuple[str, ...], note: str) -> None:
    """Make jobs due now (a job in flight is left alone)."""
    store = _store(ctx)
    _existing(store, ids)
    changed = store.run_now(*ids, by=Actor.cli(), note=note)
    _report(ctx, ids, changed, "{id} is due now", "{id}: in flight, left alone",
            "made {changed} of {total} job(s) due now")


# ---------------------------------------------------------------- partitions
@zsched.command(cls=CeleryCommand)
@click.option("--to", "to", type=click.IntRange(min=1), required=True,
              help="The partition count to move the store to.")
@click.option("--force", is_flag=True,
              help="Go on although beats or workers announced themselves within the last "
                   "three heartbeats (only when they died without shutting down).")
@click.pass_context
@_errors
def repartition(ctx: click.Context, to: int, force: bool) -> None:
    """Move the store to TO partitions. Stop beat and workers first.

    Resumes an interrupted run. Afterwards set zsched_partitions=TO everywhere
    (beat, workers, Django) and start them again.
    """
    settings = Settings.from_app(_app(ctx))
    client = redis_client(settings)
    try:
        with redis_unavailable():
            base = Keys.for_prefix(settings.key_prefix)
            source, _ = recorded_partitions(client, base)
            total = sum(int(client.hlen(keys.defs)) for keys in base.partitions(source))
            with _progress(total, "moving jobs") as progress:
                report = move_partitions(client, settings, to, force=force, progress=progress)
    except RepartitionRefused as exc:
        _fail(str(exc), EX_TEMPFAIL)
    finally:
        client.close()
    if report.source == report.target:
        _echo(ctx, f"the store already has {to} partition(s); nothing to do")
        return
    _echo(ctx, f"repartitioned {report.source} -> {report.target}: moved {report.moved} "
               f"job(s), kept {report.kept} in place, in {report.seconds:.1f}s")
    _echo(ctx, f"now set zsched_partitions={to} for beat, workers and Django, then start them")


# ------------------------------------------------------------------ domains
# Last: cli_domains imports this module's helpers (_store, _errors ...), so it
# can only be loaded once they exist.
from celery_zsched.cli.domains import domains  # noqa: E402

zsched.add_command(domains)

# ------------------------------------------------------------- dead letters
from celery_zsched.cli.dead import dead_group  # noqa: E402  (imports this module's helpers too)

zsched.add_command(dead_group)

# ----------------------------------------------------------------- exporter
from celery_zsched.cli.exporter import exporter  # noqa: E402  (imports this module's helpers too)

zsched.add_command(exporter)

# --------------------------------------------------------------- next fires
from celery_zsched.cli.next_fires import COMMAND as next_command  # noqa: E402  (imports this module's helpers)

zsched.add_command(next_command)

# ------------------------------------------------------------ audit history
from celery_zsched.cli.history import COMMAND as history_command  # noqa: E402  (imports this module's helpers)

zsched.add_command(history_command)

# -------------------------------------------------------------------- serve
from celery_zsched.cli.serve import serve  # noqa: E402  (imports this module's helpers too)

zsched.add_command(serve)
