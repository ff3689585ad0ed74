"""``import`` and ``export``: files of jobs, and the schedulers jobs move from."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO, cast

import click
import redis
from celery.bin.base import CeleryCommand

from celery_zsched.cli import helpers
from celery_zsched.cli.helpers import (
    EX_UNAVAILABLE,
    MAX_LISTED,
    app_of,
    defaults_of,
    echo,
    fail,
    handles_errors,
    option,
    progress_bar,
    store_of,
    terminal_safe,
    warn,
)
from celery_zsched.core.formats import FORMATS, detect_format, iter_rows
from celery_zsched.core.rows import import_actor, parse_rows, write_rows
from celery_zsched.services.appstore import app_timezone
from celery_zsched.services.sources import (
    DJANGO_CELERY_BEAT,
    REDBEAT,
    REDBEAT_DEFAULT_PREFIX,
    read_redbeat,
    redbeat_client,
    switch_to_store,
)


# ------------------------------------------------------------ import/export
@click.command("import", cls=CeleryCommand)
@option("-f", "--file", "path", type=click.Path(dir_okay=False),
         group="Import Options", help="File of jobs (.json, .jsonl or .csv).")
@option("--from", "source", type=click.Choice([REDBEAT, DJANGO_CELERY_BEAT]),
         group="Import Options",
         help="Move redbeat's entries instead of a file; each job's next run is the one "
              "redbeat would have made.")
@option("--redbeat-prefix", group="Import Options",
         help="redbeat's key prefix (default: the app's redbeat_key_prefix, else 'redbeat:').")
@option("--redbeat-url", group="Import Options",
         help="Redis URL of redbeat's keys (default: the zsched Redis).")
@option("--format", "fmt", type=click.Choice(FORMATS), group="Import Options",
         help="File format (default: from the suffix).")
@option("--skip-invalid", is_flag=True, group="Import Options",
         help="Store the valid rows and report the others (default: store nothing).")
@option("--dry-run", is_flag=True, group="Import Options",
         help="Validate only; write nothing.")
@click.pass_context
@handles_errors
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
    store = store_of(ctx)
    started = time.perf_counter()
    result = parse_rows(iter_rows(path, fmt), defaults_of(ctx, store),
                        skip_invalid=skip_invalid)
    parsed_s = time.perf_counter() - started
    for error in result.errors[:MAX_LISTED]:
        warn(f"skipped {error}")
    if len(result.errors) > MAX_LISTED:
        warn(f"... and {len(result.errors) - MAX_LISTED} more")
    count = len(result.jobs)
    if dry_run:
        echo(ctx, f"dry run: {count} valid job(s), {len(result.errors)} invalid job(s) "
                   f"in {parsed_s:.2f}s; nothing written")
        return
    warn(f"validated {count} job(s) in {parsed_s:.2f}s")
    with progress_bar(count, f"storing {path}") as progress:
        report = store.upsert_many(result.jobs, stagger=True, total=count, progress=progress,
                                   by=import_actor(path))
    skipped = f", skipped {len(result.errors)} invalid job(s)" if result.errors else ""
    echo(ctx, f"imported {count} job(s): created {report.created}, updated {report.updated}, "
               f"rescheduled {report.rescheduled}{skipped} in "
               f"{time.perf_counter() - started:.2f}s")


def _import_from(ctx: click.Context, source: str, prefix: str | None, url: str | None,
                 dry_run: bool, skip_invalid: bool) -> None:
    if source == DJANGO_CELERY_BEAT:
        raise click.UsageError("django-celery-beat's tasks are read through Django: run "
                               "`python manage.py zsched_import --from django-celery-beat`")
    app, store = app_of(ctx), store_of(ctx)
    try:
        read = read_redbeat(redbeat_client(url, store), defaults_of(ctx, store),
                            prefix=prefix or app.conf.get("redbeat_key_prefix") or
                            REDBEAT_DEFAULT_PREFIX, timezone=app_timezone(app))
    except redis.RedisError as exc:
        fail(f"cannot read redbeat's entries: {exc}; nothing written", EX_UNAVAILABLE)
    for line in switch_to_store(store, read, dry_run=dry_run, skip_invalid=skip_invalid).lines():
        echo(ctx, line)


@contextlib.contextmanager
def _output(path: str) -> Iterator[TextIO]:
    """stdout for ``-``; else a temporary file that replaces ``path`` only on success."""
    if path == "-":
        # An export is data, but one shown on a terminal is text to read: escaped too.
        yield cast("TextIO", _TerminalSafe(sys.stdout)) if helpers.on_tty() else sys.stdout
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


@click.command("export", cls=CeleryCommand)
@option("-f", "--file", "path", default="-", type=click.Path(dir_okay=False, allow_dash=True),
         group="Export Options", help="Output file (default: stdout).")
@option("--format", "fmt", type=click.Choice(FORMATS), group="Export Options",
         help="Output format (default: from the suffix, json on stdout).")
@click.pass_context
@handles_errors
def export(ctx: click.Context, path: str, fmt: str | None) -> None:
    """Write every job definition to a file that `zsched import` reads back."""
    if fmt is None:
        fmt = "json" if path == "-" else detect_format(path)
    store = store_of(ctx)
    started = time.perf_counter()
    with _output(path) as fp:
        count = write_rows(store.iter_jobs(), fp, fmt)
    where = "stdout" if path == "-" else path
    warn(f"exported {count} job(s) to {where} in {time.perf_counter() - started:.2f}s")

