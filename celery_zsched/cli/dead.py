"""``celery -A proj zsched dead [list|show|requeue|purge]``: the dead-letter queue.

A job is dead-lettered when one occurrence's worker died ``max_deliveries``
times in a row (see :mod:`celery_zsched.store.dead`). ``requeue`` makes it due now
with its counters reset; ``purge`` drops the dead letter and keeps the job,
paused: a definition that came from an import or the database is not thrown
away by acknowledging one bad night (``zsched delete ID`` removes it).

Each action is one pipeline of control scripts over the whole selection,
grouped by partition. Attached to the ``zsched`` group at the end of
:mod:`celery_zsched.cli`, whose error handling (one-line messages, exit
codes) it shares.
"""

from __future__ import annotations

import json
from typing import Any

import click

from celery_zsched.cli.helpers import EX_NOT_FOUND, NOTE, echo, fail, handles_errors, store_of
from celery_zsched.core.audit import Actor
from celery_zsched.store import Store, dead
from celery_zsched.store.dead import DeadLetter


def _row(letter: DeadLetter, now_ms: int) -> dict[str, Any]:
    info = letter.info
    return {
        "id": letter.job_id,
        "name": info.job.name if info else None,
        "url": info.job.url if info else None,
        "task": letter.task or None,
        "died_at": dead.iso(letter.died_ms),
        "died_ago": dead.ago(letter.died_ms, now_ms),
        "deliveries": letter.deliveries,
        "last_error": letter.last_error or None,
        "status": info.status if info else None,
        "paused": info.paused if info else None,
    }


def _table(letters: list[DeadLetter], now_ms: int) -> list[str]:
    rows = [("ID", "DIED (UTC)", "DELIVERIES", "TASK", "NAME / URL", "LAST ERROR")]
    rows += [(d.job_id, f"{dead.iso(d.died_ms)} ({dead.ago(d.died_ms, now_ms)})",
              str(d.deliveries), d.task or "-", d.target or "-",
              dead.short(d.last_error) or "-") for d in letters]
    widths = [max(len(row[col]) for row in rows) for col in range(5)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[5]])
            for row in rows]


@click.group(name="dead")
def dead_group() -> None:
    """The dead-letter queue: jobs whose worker died max_deliveries times in a row.

    `list` and `show` read it; `requeue` makes jobs due now with their counters
    reset; `purge` drops dead letters and keeps the jobs, paused.
    """


@dead_group.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Dead letters to show, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handles_errors
def list_(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The newest dead letters: job, time of death, deliveries, last error."""
    store = store_of(ctx)
    letters, now, total = dead.latest(store, limit), store.now_ms(), dead.count(store)
    if as_json:
        echo(ctx, json.dumps([_row(d, now) for d in letters], indent=2, ensure_ascii=False))
        return
    if not letters:
        echo(ctx, "no dead letters")
        return
    for line in _table(letters, now):
        echo(ctx, line)
    if total > len(letters):
        echo(ctx, f"... {total - len(letters)} more (--limit)")


@dead_group.command()
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handles_errors
def show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """One dead letter, with its whole last error."""
    store = store_of(ctx)
    letter = dead.lookup(store, [job_id])[0]
    if letter is None:
        fail(f"{job_id} is not dead-lettered", EX_NOT_FOUND)
    row = _row(letter, store.now_ms())
    if as_json:
        echo(ctx, json.dumps(row, indent=2, ensure_ascii=False))
        return
    row["died_at"] = f"{row.pop('died_at')} ({row.pop('died_ago')})"
    for key, value in row.items():
        echo(ctx, f"{key + ':':<12} {'-' if value is None else value}")


def _selection(store: Store, ids: tuple[str, ...], every: bool) -> list[str]:
    """The ids to act on: every dead letter, or the given ones, all of them dead letters."""
    if every == bool(ids):
        raise click.UsageError("give dead-lettered IDs or --all (not both)")
    if every:
        return dead.all_ids(store)
    missing = [i for i, died in zip(ids, dead.died_at(store, ids), strict=True)
               if died is None]
    if missing:
        fail(f"not dead-lettered: {', '.join(missing)}; nothing changed", EX_NOT_FOUND)
    return list(dict.fromkeys(ids))


_IDS = click.argument("ids", metavar="[ID]...", nargs=-1)
_ALL = click.option("--all", "every", is_flag=True, help="Every dead letter.")


@dead_group.command()
@_IDS
@_ALL
@NOTE
@click.pass_context
@handles_errors
def requeue(ctx: click.Context, ids: tuple[str, ...], every: bool, note: str) -> None:
    """Make dead-lettered jobs due now, unpaused, with their crash, attempt and
    failure-streak counters reset (all-time failures and the last error stay)."""
    store = store_of(ctx)
    chosen = _selection(store, ids, every)
    changed = store.requeue_dead(*chosen, by=Actor.cli(), note=note) if chosen else 0
    echo(ctx, f"requeued {changed} of {len(chosen)} dead letter(s); due now")


@dead_group.command()
@_IDS
@_ALL
@click.option("--yes", is_flag=True, help="Do not ask before purging --all.")
@NOTE
@click.pass_context
@handles_errors
def purge(ctx: click.Context, ids: tuple[str, ...], every: bool, yes: bool, note: str) -> None:
    """Drop dead letters; the jobs are kept, paused (`zsched resume` runs them again,
    `zsched delete` removes them)."""
    store = store_of(ctx)
    chosen = _selection(store, ids, every)
    if every and chosen and not yes:
        click.confirm(f"purge all {len(chosen)} dead letter(s), pausing their jobs?",
                      abort=True)
    changed = store.purge_dead(*chosen, by=Actor.cli(), note=note) if chosen else 0
    echo(ctx, f"purged {changed} of {len(chosen)} dead letter(s); their jobs are paused")
