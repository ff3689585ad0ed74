"""Serve the app with uvicorn, shutting down gracefully.

On SIGTERM or SIGINT the gateway first stops taking polls and answers the
waiting ones ``503`` (uvicorn alone would wait for every long-poll to time
out), then uvicorn finishes the requests in flight, and the lifespan's end
releases what was claimed for pollers that are gone.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from celery_zsched.server.app import create_app
from celery_zsched.server.edge import BACKLOG, Limits, guarded_protocol
from celery_zsched.services.writer import JobWriter
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched.server")
#: Longest uvicorn waits for requests in flight at shutdown.
GRACEFUL_S = 10


class _Server(uvicorn.Server):
    """uvicorn's server, telling the dispatcher first when a signal asks it to stop."""

    def __init__(self, config: uvicorn.Config, on_exit: Any) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def event_loop(loop: str = "auto") -> str:
    """uvicorn's name of the event loop ``loop`` means: ``auto`` is uvloop when it is
    installed (the ``standard`` extra), else asyncio; ``ValueError`` if not installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if loop == "uvloop":
            raise ValueError("event loop 'uvloop' is not installed: pip install "
                             "'celery-zsched[server]' (uvicorn[standard])") from None
        return "asyncio"
    return "uvloop" if loop == "auto" else loop


def _log_events(level: str) -> None:
    """Send celery-zsched's structured events (job_complete, job_error, ...) to stderr.

    A Celery worker logs them through Celery's logging; this process has none.
    A handler someone configured already is left alone.
    """
    logger = logging.getLogger("celery_zsched")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level.upper())
        logger.propagate = False


def serve(store: Store, host: str, port: int, *, log_level: str = "info",
          sender: Any = None, writer: JobWriter | None = None, loop: str = "auto",
          http: str = "auto") -> None:
    """Run the server on ``host:port`` until a signal stops it.

    ``sender``: the Celery app, whose notifiers hear the server's settles and reaps.
    ``writer``: where the management API's changes go (default: the store).
    ``loop`` (``auto``, ``asyncio``, ``uvloop``) and ``http`` (``auto``, ``h11``,
    ``httptools``): the event loop and HTTP parser; ``auto`` takes uvloop and
    httptools when they are installed (the ``standard`` extra).
    """
    _log_events(log_level)
    app = create_app(store, sender=sender, writer=writer)
    config = server_config(app, host, port, log_level=log_level, loop=loop, http=http)
    _Server(config, app.state.gateway.dispatcher.begin_shutdown_threadsafe).run()


def server_config(app: FastAPI, host: str, port: int, *, loop: str = "auto",
                  http: str = "auto", **options: Any) -> uvicorn.Config:
    """uvicorn's configuration of ``app`` (made by :func:`create_app`): its guarded
    protocol (connection cap, header and body timeouts) on the ``http`` parser, the
    ``loop`` (see :func:`serve`) and the keep-alive timeout."""
    limits: Limits = app.state.limits
    protocol = guarded_protocol(limits, http)
    loop = event_loop(loop)
    logger.info("zsched serve: at most %d connections and %d long-polls; header timeout "
                "%gs, body timeout %gs, keep-alive %gs; %s loop, %s parser",
                limits.max_connections, limits.max_polls, limits.header_timeout_s,
                limits.body_timeout_s, limits.keepalive_s, loop, protocol.parser)
    values: dict[str, Any] = {"timeout_graceful_shutdown": GRACEFUL_S, "lifespan": "on",
                              "access_log": False, **options}
    # uvicorn's keep-alive timeout takes whole seconds in its signature, but only
    # hands the value to call_later: a fraction works.
    return uvicorn.Config(app, host=host, port=port, http=protocol, loop=loop,
                          backlog=BACKLOG, timeout_keep_alive=limits.keepalive_s,  # type: ignore[arg-type]
                          **values)
