"""``celery -A proj zsched next ID [-n 10] [--json]``: a job's upcoming fire times.

Read from the store (definition, due time, runs so far) and worked out by
:mod:`celery_zsched.services.preview` with the scheduler's own rules. Attached to the
``zsched`` group at the end of :mod:`celery_zsched.cli`, whose error handling
(one-line messages, exit codes) it shares.
"""

from __future__ import annotations

import json

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import echo, handles_errors, store_of
from celery_zsched.services.preview import Fire, Preview, preview_info

#: Most fires one call lists: each cron fire costs a croniter step.
MAX_FIRES = 1000


def _jitter(fire: Fire) -> str:
    return f"+0..{fire.jitter_ms / 1000:g}s" if fire.jitter_ms else "-"


def _lines(result: Preview) -> list[str]:
    rows = [("#", "LOCAL", "UTC", "JITTER", "")]
    rows += [(str(i), f.local.strftime("%Y-%m-%d %H:%M:%S %Z (%z)"),
              f.utc.strftime("%Y-%m-%d %H:%M:%SZ"), _jitter(f), f.dst_note)
             for i, f in enumerate(result.fires, 1)]
    widths = [max(len(row[col]) for row in rows) for col in range(4)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                       row[4]]).rstrip() for row in rows]


@click.command("next", cls=CeleryCommand)
@click.argument("job_id", metavar="ID")
@click.option("-n", "--count", "count", type=click.IntRange(1, MAX_FIRES), default=10,
              show_default=True, help=f"How many fire times to list (1-{MAX_FIRES}).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handles_errors
def next_(ctx: click.Context, job_id: str, count: int, as_json: bool) -> None:
    """The next fire times of job ID, in its time zone and in UTC.

    Follows the job's rules: jitter (each fire lands in [time, time + jitter]),
    start_at, end_at, max_runs and pause; marks fires shifted by a DST gap or
    repeated in a DST fold.
    """
    store = store_of(ctx)
    info = store.get(job_id)
    result = preview_info(info, store.now_ms(), count, store.settings)
    if as_json:
        echo(ctx, json.dumps({"id": job_id, "kind": info.job.kind,
                               "timezone": info.job.timezone, **result.to_dict()},
                              indent=2, ensure_ascii=False))
        return
    spec = info.job.cron or (f"every {info.job.interval_s:g}s" if info.job.interval_s
                             else "once")
    echo(ctx, f"{job_id}: {spec}, zone {info.job.timezone}, {result.status}")
    if result.fires:
        for line in _lines(result):
            echo(ctx, line)
    if result.note:
        echo(ctx, result.note)


# Declared with its type: cli.py imports it while this module and cli.py form
# an import cycle, where mypy cannot infer a decorated function's type.
COMMAND: click.Command = next_
