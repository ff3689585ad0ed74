"""``celery -A proj zsched serve [--host --port]``: the HTTP job gateway and REST API.

Attached to the ``zsched`` group at the end of :mod:`celery_zsched.cli`, whose
error handling (one-line messages, exit codes) it shares. The server is in
:mod:`celery_zsched.server` (the ``server`` extra: FastAPI and uvicorn).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, cast

import click
from celery.bin.base import CeleryCommand

from celery_zsched.cli.helpers import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    app_of,
    echo,
    fail,
    handles_errors,
    store_of,
)
from celery_zsched.config import api_token_scopes
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.services import extensions
from celery_zsched.services.writer import JobWriter, StoreWriter
from celery_zsched.store import Store

if TYPE_CHECKING:
    from celery_zsched.services.writer import WriterChoice


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
@click.option("--loop", type=click.Choice(["auto", "asyncio", "uvloop"]), default="auto",
              show_default=True,
              help="Event loop: auto is uvloop when it is installed (uvicorn[standard]).")
@click.option("--http", type=click.Choice(["auto", "h11", "httptools"]), default="auto",
              show_default=True,
              help="HTTP parser: auto is httptools when it is installed (uvicorn[standard]).")
@click.pass_context
@handles_errors
def serve(ctx: click.Context, host: str, port: int, log_level: str, writer: str, loop: str,
          http: str) -> None:
    """Serve the job gateway (/jobs/next, reports) and the REST API (/v1/jobs) until stopped."""
    try:
        from celery_zsched.server.runner import (
            serve as run,  # FastAPI and uvicorn: the server extra
        )
    except ImportError as exc:
        fail(f"zsched serve needs FastAPI and uvicorn ({exc}): "
              "pip install 'celery-zsched[server]'", EX_CONFIG)
    store = store_of(ctx)
    if not api_token_scopes(store.settings.api_tokens):
        echo(ctx, "warning: zsched_api_tokens is empty, so every request is refused (401)")
    # Fail with one line, before uvicorn logs a traceback, when the port is taken.
    try:
        with socket.create_server((host, port), reuse_port=False):
            pass
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc}", EX_UNAVAILABLE)
    # In a Django project the row is the definition: writing Redis alone would be
    # undone by the next reconcile.
    job_writer, which = choose_writer(store, cast("WriterChoice", writer))
    echo(ctx, which)
    echo(ctx, f"serving the zsched job gateway and REST API on http://{host}:{port} (prefix "
               f"{store.base.prefix}); Ctrl-C stops")
    # The notifiers hear the server's settles and reaps, as a worker's and beat's.
    app = app_of(ctx)
    extensions.start(app, "serve")
    try:
        run(store, host, port, log_level=log_level, sender=app, writer=job_writer, loop=loop,
            http=http)
    finally:
        extensions.stop("serve")


DJANGO_APP = "celery_zsched.contrib.django"


def django_app_installed() -> bool:
    """Whether Django is configured with the celery-zsched app (set up here if need be).

    Celery's Django fixup sets ``DJANGO_SETTINGS_MODULE`` but sets Django up
    only in workers; ``zsched serve`` is not one.
    """
    try:
        import django
        from django.apps import apps
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        return False
    if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
        return False
    if not apps.ready:
        try:
            django.setup()
        except (ImproperlyConfigured, ImportError) as exc:
            raise ConfigurationError(f"Django settings: {exc}") from exc
    return bool(apps.is_installed(DJANGO_APP))


def choose_writer(store: Store, choice: WriterChoice = "auto") -> tuple[JobWriter, str]:
    """The writer of ``zsched serve`` and a line saying which one it is.

    Raises :class:`ConfigurationError` when ``django`` is asked for without the
    app, or when the app's store is not ``store`` (another key prefix): the API
    would read jobs other than those it writes.
    """
    use_django = django_app_installed() if choice != "store" else False
    if choice == "django" and not use_django:
        raise ConfigurationError(f"--writer django: Django is not configured with {DJANGO_APP} "
                                 "in INSTALLED_APPS (set DJANGO_SETTINGS_MODULE)")
    if not use_django:
        return StoreWriter(store), "REST API writes: Redis store"
    from celery_zsched.contrib.django.api_writer import ModelWriter
    from celery_zsched.contrib.django.conf import get_store

    theirs = get_store().base.prefix
    if theirs != store.base.prefix:
        raise ConfigurationError(f"the Django app's key prefix {theirs!r} is not this server's "
                                 f"{store.base.prefix!r}: give both the same zsched_key_prefix")
    writer = ModelWriter()
    return writer, f"REST API writes: Django models (db alias {writer.using})"
