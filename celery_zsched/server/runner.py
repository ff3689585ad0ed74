"""Serve the app with uvicorn, shutting down gracefully.

On SIGTERM or SIGINT the gateway first stops taking polls and answers the
waiting ones ``503`` (uvicorn alone would wait for every long-poll to time
out), then uvicorn finishes the requests in flight, and the lifespan's end
releases what was claimed for pollers that are gone.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn

from ..store import Store
from .app import create_app

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


def serve(store: Store, host: str, port: int, *, log_level: str = "info") -> None:
    """Run the server on ``host:port`` until a signal stops it."""
    app = create_app(store)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=GRACEFUL_S, lifespan="on",
                            access_log=False)
    _Server(config, app.state.gateway.dispatcher.begin_shutdown_threadsafe).run()
