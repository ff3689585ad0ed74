"""The ASGI app of ``zsched serve``: the routers, shared auth, errors, lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..config import api_token_scopes
from ..errors import StoreUnavailable
from ..store import Store
from . import gateway
from .auth import Tokens, require
from .dispatcher import Dispatcher
from .lease import LeaseSigner
from .problems import Problem

#: Retry-After of a 503 when a report or heartbeat found Redis unreachable.
STORE_RETRY_S = 2
#: Threads that run store calls (redis-py blocks). asyncio's default is
#: cpu + 4, which would queue a burst of reports behind a handful of calls.
STORE_THREADS = 32


def create_app(store: Store, *, sender: Any = None) -> FastAPI:
    """The server for ``store``, configured by its settings (tokens, timeouts).

    ``sender`` (the Celery app) sends the signals of its settles and reaps, as a
    worker and beat do (:mod:`celery_zsched.signals`): the notifiers hear HTTP jobs too.
    """
    settings = store.settings
    dispatcher = Dispatcher(store, sender=sender)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="zsched-store"))
        dispatcher.start()
        try:
            yield
        finally:
            await dispatcher.close()

    # No token, no access: the OpenAPI document too (any scope may read it), and
    # no /docs page (it would load its scripts from a CDN).
    app = FastAPI(title="celery-zsched", version="1", lifespan=lifespan,
                  summary="Job gateway for workers in any language",
                  openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require(None))])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())
    app.state.tokens = Tokens(api_token_scopes(settings.api_tokens))
    app.state.gateway = gateway.Gateway(
        store=store, dispatcher=dispatcher,
        signer=LeaseSigner.for_settings(store.base.prefix, settings.api_tokens),
        timeout_s=settings.gateway_timeout_s, lease_s=settings.gateway_lease_s, sender=sender)
    app.include_router(gateway.router)

    @app.exception_handler(Problem)
    async def problem(_: Request, exc: Problem) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body")]
        return Problem(400, "invalid request",
                       f"{'.'.join(loc) or 'request'}: {first.get('msg', 'invalid')}",
                       field=".".join(loc) or "request").response()

    @app.exception_handler(StoreUnavailable)
    async def unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return Problem(503, "store unavailable", "Redis is unreachable; send it again",
                       headers={"Retry-After": str(STORE_RETRY_S)}).response()

    return app
