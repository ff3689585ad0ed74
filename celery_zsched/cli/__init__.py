"""``celery -A proj zsched ...``: manage the job store from the command line.

Installed through the ``celery.commands`` entry point, so Celery's own ``-A``
picks the app, whose ``zsched_*`` settings pick the store.

Exit status: 0 success, 1 unknown job id, 2 bad usage, 65 invalid job or
import file (nothing written), 69 Redis unreachable, 75 repartition refused (beat
or workers still alive), 78 bad ``zsched_*`` setting.
"""

from __future__ import annotations

import click
from celery.bin.base import handle_preload_options

from celery_zsched.cli.dead import dead_group
from celery_zsched.cli.domains import domains
from celery_zsched.cli.exporter import exporter
from celery_zsched.cli.files import export, import_
from celery_zsched.cli.history import COMMAND as history_command
from celery_zsched.cli.jobs import add, delete, list_, pause, resume, run_now, show, stats
from celery_zsched.cli.next_fires import COMMAND as next_command
from celery_zsched.cli.partitions import repartition
from celery_zsched.cli.serve import serve


@click.group(name="zsched")
@click.pass_context
@handle_preload_options
def zsched(ctx: click.Context) -> None:
    """Manage celery-zsched jobs: add, import, export, list, pause, resume, run now;
    per-domain pacing (domains); and the dead-letter queue (dead)."""


for command in (add, import_, export, list_, show, stats, delete, pause, resume, run_now,
                repartition, domains, dead_group, exporter, next_command, history_command,
                serve):
    zsched.add_command(command)
