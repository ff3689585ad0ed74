"""``celery -A proj zsched history ID [-n 20] [--json]``: a job's recorded changes.

Read from the job's partition's audit stream (:mod:`celery_zsched.core.audit`),
newest first; a deleted job's history stays readable until the capped stream
drops it. Attached to the ``zsched`` group at the end of :mod:`celery_zsched.cli`,
whose error handling (one-line messages, exit codes) it shares.
"""

from __future__ import annotations

import json
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import echo, handles_errors, store_of
from celery_zsched.core.audit import Change
from celery_zsched.core.errors import JobNotFound
from celery_zsched.store import audit_log

#: Most changes one call lists.
MAX_CHANGES = 10_000
#: A diff value longer than this is cut in the text output (``--json`` has it whole).
VALUE_WIDTH = 80


def _value(value: Any) -> str:
    text = "-" if value is None else json.dumps(value, ensure_ascii=False,
                                               separators=(",", ":"))
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 3] + "..."


def _when(change: Change) -> str:
    utc = change.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    local = change.at.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"{utc} ({local})"


def lines(change: Change) -> list[str]:
    """One change as text: a heading line, then the note and one line per field."""
    out = [f"{_when(change)}  {change.action}  by {change.actor}"]
    if change.note:
        out.append(f"    note: {change.note}")
    out += [f"    {name}: {_value(old)} -> {_value(new)}"
            for name, (old, new) in change.diff.items()]
    return out


@click.command("history", cls=CeleryCommand)
@click.argument("job_id", metavar="ID")
@click.option("-n", "--count", "count", type=click.IntRange(1, MAX_CHANGES), default=20,
              show_default=True, help=f"How many changes to list (1-{MAX_CHANGES}).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list, newest first).")
@click.pass_context
@handles_errors
def history(ctx: click.Context, job_id: str, count: int, as_json: bool) -> None:
    """The recorded changes of job ID, newest first: when (UTC and this host's
    local time), what (create, edit, pause, ...), who, the note and the field diff."""
    store = store_of(ctx)
    changes = audit_log.history(store, job_id, count)
    if not changes and store.get_many([job_id]) == [None]:
        raise JobNotFound(job_id)
    if as_json:
        echo(ctx, json.dumps([c.as_dict() for c in changes], indent=2, ensure_ascii=False))
        return
    if not changes:
        echo(ctx, f"{job_id}: no recorded changes (zsched_audit_maxlen may be 0, or the "
                   "stream dropped them)")
        return
    for change in changes:
        for line in lines(change):
            echo(ctx, line)


# Declared with its type: cli.py imports it while this module and cli.py form
# an import cycle, where mypy cannot infer a decorated function's type.
COMMAND: click.Command = history
