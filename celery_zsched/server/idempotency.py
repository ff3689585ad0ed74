"""``Idempotency-Key``: a retried POST returns the first answer and does nothing twice.

The first request with a key claims it in Redis (``SET NX``) before it acts, and
stores its answer when done; a retry with the same key and the same body gets that
answer back (header ``Idempotent-Replayed: true``). A retry while the first is
still running gets ``409``; the same key with another body gets ``422``. Keys are
per token and per route, so one client's keys never answer another's requests.
Answers are kept :data:`KEEP_S`; a request that failed on the server (5xx) or
crashed releases its key, so its retry acts afresh.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from celery_zsched.server.auth import token_identity
from celery_zsched.server.problems import Problem
from celery_zsched.store import Store
from celery_zsched.store.errors import redis_unavailable

#: How long a first answer is kept for retries (a day, as Stripe keeps them).
KEEP_S = 24 * 3600
#: How long a claim lasts without an answer: a server that died mid-request
#: leaves its key claimed this long, then a retry acts afresh.
CLAIM_S = 120
#: Longest key accepted (Stripe's limit).
MAX_KEY = 255
_PENDING = "pending"
#: What a route that takes the header adds to its OpenAPI operation (``openapi_extra``).
OPENAPI_HEADER: dict[str, Any] = {"parameters": [{
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "Any unique string: a retry with the same key and body gets the first "
                   "answer back (Idempotent-Replayed: true) and does nothing twice.",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY}}]}
#: The answers the header adds to a route's own.
RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"description": "A request with this Idempotency-Key is still running: retry "
                         "after Retry-After (or, on create, a job with this id exists)"},
    422: {"description": "This Idempotency-Key was used with a different request"}}


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _replay(record: dict[str, Any]) -> Response:
    headers = {**record.get("headers", {}), "Idempotent-Replayed": "true"}
    return JSONResponse(record["body"], status_code=record["status"], headers=headers,
                        media_type=record.get("media_type", "application/json"))


async def once(request: Request, store: Store, body: bytes,
               act: Callable[[], Awaitable[Response]]) -> Response:
    """Run ``act`` at most once per ``Idempotency-Key`` (no header: every time)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return await act()
    if not 1 <= len(key) <= MAX_KEY or not key.isprintable():
        raise Problem(400, "invalid request",
                      f"Idempotency-Key: must be 1 to {MAX_KEY} printable characters",
                      field="Idempotency-Key")
    # Scoped to the token itself, not to its header's spelling ("bearer", two spaces):
    # the same client retrying must get its first answer back.
    redis_key = store.base.idempotency(
        _digest(token_identity(request), request.method, request.url.path, key))
    fingerprint = _digest(request.url.query, body)
    claimed, raw = await asyncio.to_thread(_claim, store, redis_key, fingerprint)
    if not claimed:
        if raw is None:  # it expired between the SET and the GET: a claim went stale
            raise Problem(409, "request in progress",
                          "a request with this Idempotency-Key was just running; retry",
                          field="Idempotency-Key", headers={"Retry-After": "1"})
        record = json.loads(raw)
        if record.get("fp") != fingerprint:
            raise Problem(422, "Idempotency-Key reused",
                          "this Idempotency-Key was used with a different request",
                          field="Idempotency-Key")
        if record.get("state") == _PENDING:
            raise Problem(409, "request in progress",
                          "the first request with this Idempotency-Key is still running",
                          field="Idempotency-Key", headers={"Retry-After": "1"})
        return _replay(record)
    try:
        response = await act()
    except Problem as problem:
        response = problem.response()
    except BaseException:
        await asyncio.to_thread(_release, store, redis_key)
        raise
    if response.status_code >= 500:
        await asyncio.to_thread(_release, store, redis_key)
    else:
        await asyncio.to_thread(_keep, store, redis_key, fingerprint, response)
    return response


def _claim(store: Store, redis_key: str, fingerprint: str) -> tuple[bool, str | None]:
    """Claim the key; if another request has it, its record (None if it just expired)."""
    with redis_unavailable():
        claimed = store.client.set(
            redis_key, json.dumps({"state": _PENDING, "fp": fingerprint}), nx=True, ex=CLAIM_S)
        return bool(claimed), None if claimed else store.client.get(redis_key)


def _release(store: Store, redis_key: str) -> None:
    with redis_unavailable():
        store.client.delete(redis_key)


def _keep(store: Store, redis_key: str, fingerprint: str, response: Response) -> None:
    headers = {name: value for name, value in response.headers.items()
               if name.lower() in ("location", "etag", "retry-after")}
    record = {"state": "done", "fp": fingerprint, "status": response.status_code,
              "body": json.loads(bytes(response.body)) if response.body else None,
              "headers": headers, "media_type": response.media_type}
    with redis_unavailable():
        store.client.set(redis_key, json.dumps(record), ex=KEEP_S)
