"""``celery -A proj zsched exporter --port N``: serve the store's Prometheus metrics.

Attached to the ``zsched`` group at the end of :mod:`celery_zsched.cli`, whose
error handling (one-line messages, exit codes) it shares. The metrics and how
they are read are in :mod:`celery_zsched.metrics.exporter`.
"""

from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    echo,
    fail,
    handles_errors,
    store_of,
)


@click.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(1, 65535), required=True,
              help="TCP port of /metrics.")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 to be scraped from other hosts.")
@click.option("--top-domains", type=click.IntRange(0), default=10, show_default=True,
              help="Per-domain series for at most this many throttled or open domains.")
@click.pass_context
@handles_errors
def exporter(ctx: click.Context, port: int, addr: str, top_domains: int) -> None:
    """Serve Prometheus metrics read from Redis on each scrape, until interrupted."""
    try:
        from celery_zsched.metrics.exporter import serve  # prometheus_client is only needed here
    except ImportError as exc:
        fail(f"the exporter needs prometheus-client ({exc}): "
              "pip install 'celery-zsched[metrics]'", EX_CONFIG)

    store = store_of(ctx)
    try:
        server, thread = serve(store, port, addr, top_domains)
    except OSError as exc:
        fail(f"cannot listen on {addr}:{port}: {exc}", EX_UNAVAILABLE)
    echo(ctx, f"serving zsched metrics on http://{addr}:{port}/metrics (prefix "
               f"{store.base.prefix}); Ctrl-C stops")
    try:
        # Redis being down is not fatal: each scrape says zsched_up 0 meanwhile.
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
