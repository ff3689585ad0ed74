"""``celery -A proj zsched serve [--host --port]``: the HTTP job gateway and REST API.

Attached to the ``zsched`` group at the end of :mod:`celery_zsched.cli`, whose
error handling (one-line messages, exit codes) it shares. The server is in
:mod:`celery_zsched.server` (the ``server`` extra: FastAPI and uvicorn).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, cast

import click
from celery.bin.base import CeleryCommand

from celery_zsched import notify
from celery_zsched.cli import EX_CONFIG, EX_UNAVAILABLE, _app, _echo, _errors, _fail, _store
from celery_zsched.config import api_token_scopes

if TYPE_CHECKING:
    from celery_zsched.server.writer import WriterChoice


@click.command(cls=CeleryCommand)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 to serve workers on other hosts.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True,
              help="TCP port.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              help="uvicorn's log level.")
@click.option("--writer", type=click.Choice(["auto", "store", "django"]), default="auto",
              show_default=True,
              help="Where the REST API writes definitions: the Django models (auto: when "
                   "celery_zsched.contrib.django is installed) or the Redis store.")
@click.pass_context
@_errors
def serve(ctx: click.Context, host: str, port: int, log_level: str, writer: str) -> None:
    """Serve the job gateway (/jobs/next, reports) and the REST API (/v1/jobs) until stopped."""
    try:
        from celery_zsched.server.runner import (
            serve as run,  # FastAPI and uvicorn: the server extra
        )
        from celery_zsched.server.writer import choose
    except ImportError as exc:
        _fail(f"zsched serve needs FastAPI and uvicorn ({exc}): "
              "pip install 'celery-zsched[server]'", EX_CONFIG)
    store = _store(ctx)
    if not api_token_scopes(store.settings.api_tokens):
        _echo(ctx, "warning: zsched_api_tokens is empty, so every request is refused (401)")
    # Fail with one line, before uvicorn logs a traceback, when the port is taken.
    try:
        with socket.create_server((host, port), reuse_port=False):
            pass
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc}", EX_UNAVAILABLE)
    # In a Django project the row is the definition: writing Redis alone would be
    # undone by the next reconcile.
    job_writer, which = choose(store, cast("WriterChoice", writer))
    _echo(ctx, which)
    _echo(ctx, f"serving the zsched job gateway and REST API on http://{host}:{port} (prefix "
               f"{store.base.prefix}); Ctrl-C stops")
    # The notifiers hear the server's settles and reaps, as a worker's and beat's.
    app = _app(ctx)
    notify.install(app)
    try:
        run(store, host, port, log_level=log_level, sender=app, writer=job_writer)
    finally:
        notify.close_all()
