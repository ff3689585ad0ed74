"""Every error the server answers is problem+json: its own, FastAPI's and Starlette's."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.server.bodies import pydantic_fields
from celery_zsched.server.problems import Problem, bad_fields
from celery_zsched.store.moves import MoveDeferred

#: Retry-After of a 503 when a report or heartbeat found Redis unreachable.
STORE_RETRY_S = 2


#: Methods an Allow header may name.
_METHODS = ("GET", "POST", "PATCH", "DELETE")


def _allowed(request: Request) -> str:
    # Starlette's Allow names the methods of the first route whose path matched; a
    # path served by several routes (GET and POST /v1/jobs) allows all of theirs.
    routes = request.app.router.routes
    return ", ".join(method for method in _METHODS if any(
        route.matches({**request.scope, "method": method})[0] == Match.FULL
        for route in routes))


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem+json."""

    @app.exception_handler(Problem)
    async def problem(_: Request, exc: Problem) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # No route matched (404) or not this method (405): Starlette's own answers.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        title = "not found" if exc.status_code == 404 else str(exc.detail).lower()
        detail = "no route matches this path" if exc.status_code == 404 else ""
        return Problem(exc.status_code, title, detail, headers=headers).response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Every bad parameter at once, each named (?limit=0&fires=-1: both).
        found = [("request" if f == "body" else f, m) for f, m in pydantic_fields(
            exc.errors(), skip=("query", "path", "body", "header"))]
        return bad_fields(found).response()

    @app.exception_handler(MoveDeferred)
    async def deferred(_: Request, exc: MoveDeferred) -> JSONResponse:
        # The new domain moves the job to another partition, which waits for its
        # occurrence in flight to settle: nothing was written.
        return Problem(409, "conflict", str(exc), field="domain",
                       headers={"Retry-After": "5"}).response()

    @app.exception_handler(StoreUnavailable)
    async def unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return Problem(503, "store unavailable", "Redis is unreachable; send it again",
                       headers={"Retry-After": str(STORE_RETRY_S)}).response()
