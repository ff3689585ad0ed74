"""The OpenAPI document: FastAPI's, with what it cannot know added.

FastAPI documents each route's success and the ``422`` of its own validation;
this server answers validation errors ``400`` (problem+json, naming the field),
every route can answer ``401``/``403`` (the bearer token) and ``503`` (Redis
unreachable, or shutting down), and every error body is problem+json. The
document is checked in as ``docs/openapi.json`` (a test keeps it equal); regenerate
it with ``python -m celery_zsched.server.openapi > docs/openapi.json``
(:mod:`celery_zsched.server.openapi`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fastapi import FastAPI

from celery_zsched.server.views import ProblemDetail

_PROBLEM_REF = {"$ref": "#/components/schemas/ProblemDetail"}
#: Errors every route may answer, with what they mean.
_ALWAYS = {
    "400": "Malformed request: the problem's field names what is wrong",
    "401": "No token, or an unknown one",
    "403": "The token's scope does not allow this",
    "503": "Redis is unreachable or the server is shutting down: retry after Retry-After",
}
#: Errors of routes with a path parameter, and of routes that take a body.
_WITH_PATH = {"404": "No such job, or no route matches the path (a control character in "
                     "the id, say)"}
_WITH_BODY = {"413": "The body is over this route's size limit"}
_RETRY_AFTER = {"description": "Seconds to wait before sending it again.",
                "schema": {"type": "string", "pattern": "^[0-9]+$"}}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": _PROBLEM_REF}}}


def _errors(operation: dict[str, Any]) -> dict[str, str]:
    errors = dict(_ALWAYS)
    if any(p.get("in") == "path" for p in operation.get("parameters", ())):
        errors.update(_WITH_PATH)
    if "requestBody" in operation:
        errors.update(_WITH_BODY)
    return errors


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (built once per app, then copied)."""
    cached: dict[str, Any] | None = getattr(app.state, "openapi", None)
    if cached is None:
        cached = _build(app)
        app.state.openapi = cached
    return copy.deepcopy(cached)


def _build(app: FastAPI) -> dict[str, Any]:
    doc = app.openapi()
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["ProblemDetail"] = ProblemDetail.model_json_schema(
        ref_template="#/components/schemas/{model}")
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    doc["components"]["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "A token of zsched_api_tokens: scope read, write (also reads) or "
                       "worker (the job gateway)."}}
    doc["security"] = [{"bearer": []}]
    for methods in doc.get("paths", {}).values():
        for operation in methods.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            if _is_fastapi_422(responses.get("422")):
                del responses["422"]
            for status, response in responses.items():
                if int(status) >= 400 and "content" not in response:
                    responses[status] = _problem(response.get("description", ""))
            for status, description in _errors(operation).items():
                responses.setdefault(status, _problem(description))
            # Every 503 says when to retry; a 409 may (a request still in progress).
            responses["503"]["headers"] = {"Retry-After": {**_RETRY_AFTER, "required": True}}
            if "409" in responses:
                responses["409"].setdefault("headers", {})["Retry-After"] = _RETRY_AFTER
    return doc


def render(doc: dict[str, Any]) -> str:
    """``doc`` as checked in: pretty-printed, keys sorted, a trailing newline."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _is_fastapi_422(response: dict[str, Any] | None) -> bool:
    if response is None:
        return False
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref", "").endswith("/HTTPValidationError"))

