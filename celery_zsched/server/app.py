"""The ASGI app of ``zsched serve``: the routers, shared auth, errors, lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from celery_zsched.config import api_token_scopes
from celery_zsched.server import gateway, gateway_batch, handlers, imports, jobs
from celery_zsched.server.auth import Tokens, require
from celery_zsched.server.dispatcher import Dispatcher
from celery_zsched.server.edge import BodyGuard, limits_for
from celery_zsched.server.lease import LeaseSigner
from celery_zsched.server.schema import document
from celery_zsched.services.writer import JobWriter, StoreWriter
from celery_zsched.store import Store

#: Threads that run store calls (redis-py blocks). asyncio's default is
#: cpu + 4, which would queue a burst of reports behind a handful of calls.
STORE_THREADS = 32


def create_app(store: Store, *, sender: Any = None, writer: JobWriter | None = None) -> FastAPI:
    """The server for ``store``, configured by its settings (tokens, timeouts).

    ``sender`` (the Celery app) sends the signals of its settles and reaps, as a
    worker and beat do (:mod:`celery_zsched.services.signals`): the notifiers hear HTTP jobs too.
    ``writer`` takes the management API's changes (default: the store itself).
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
                  summary="Job gateway for workers in any language, and the management API",
                  openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require(None))])
    async def openapi() -> JSONResponse:
        return JSONResponse(document(app))
    app.state.store = store
    app.state.limits = limits = limits_for(settings)
    app.state.writer = writer or StoreWriter(store)
    app.state.tokens = Tokens(api_token_scopes(settings.api_tokens))
    app.state.gateway = gateway.Gateway(
        store=store, dispatcher=dispatcher,
        signer=LeaseSigner.for_settings(settings, store.base.prefix),
        timeout_s=settings.gateway_timeout_s, lease_s=settings.gateway_lease_s, sender=sender,
        max_polls=limits.max_polls)
    app.include_router(gateway.router)
    app.include_router(gateway_batch.router)
    app.include_router(imports.router)
    app.include_router(jobs.router)

    handlers.install(app)
    app.add_middleware(BodyGuard)
    return app
