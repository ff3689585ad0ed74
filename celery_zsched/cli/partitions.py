"""``repartition``: move the store to another partition count, offline."""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import EX_TEMPFAIL, app_of, echo, fail, handles_errors, progress_bar
from celery_zsched.config import Settings
from celery_zsched.store.connection import redis_client
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import Keys
from celery_zsched.store.repartition import RepartitionRefused, recorded_partitions
from celery_zsched.store.repartition import repartition as move_partitions


# ---------------------------------------------------------------- partitions
@click.command(cls=CeleryCommand)
@click.option("--to", "to", type=click.IntRange(min=1), required=True,
              help="The partition count to move the store to.")
@click.option("--force", is_flag=True,
              help="Go on although beats or workers announced themselves within the last "
                   "three heartbeats (only when they died without shutting down).")
@click.pass_context
@handles_errors
def repartition(ctx: click.Context, to: int, force: bool) -> None:
    """Move the store to TO partitions. Stop beat and workers first.

    Jobs are placed as this app's settings ask: with zsched_pacing on, a paced job
    in its domain's partition. Run it (with the same TO) after turning pacing on
    or off, or changing zsched_domain_registrable. Resumes an interrupted run.
    Afterwards set zsched_partitions=TO (and the same pacing settings) everywhere
    (beat, workers, Django) and start them again.
    """
    settings = Settings.from_app(app_of(ctx))
    client = redis_client(settings)
    try:
        with redis_unavailable():
            base = Keys.for_prefix(settings.key_prefix)
            source, _ = recorded_partitions(client, base)
            total = sum(int(client.hlen(keys.defs)) for keys in base.partitions(source))
            with progress_bar(total, "moving jobs") as progress:
                report = move_partitions(client, settings, to, force=force, progress=progress)
    except RepartitionRefused as exc:
        fail(str(exc), EX_TEMPFAIL)
    finally:
        client.close()
    if report.source_layout == report.target_layout:
        echo(ctx, f"the store already has {to} partition(s), placed as these settings ask; "
                  "nothing to do")
        return
    echo(ctx, f"repartitioned {report.source_layout} -> {report.target_layout}: moved "
               f"{report.moved} job(s), kept {report.kept} in place, in {report.seconds:.1f}s")
    echo(ctx, f"now set zsched_partitions={to} for beat, workers and Django, then start them")
    if "/" in report.target_layout and "/" not in report.source_layout:
        echo(ctx, "then run `zsched domains refresh` once, so jobs stored before pacing "
                  "was on are paced")

