"""Error answers: ``application/problem+json`` (RFC 9457) naming the field at fault."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from celery_zsched.core.errors import ValidationError

PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """An error answer. ``field`` names the request field at fault, when one is."""

    def __init__(self, status: int, title: str, detail: str = "", *, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail or title)
        self.status, self.title, self.detail = status, title, detail
        self.field, self.headers, self.extra = field, headers or {}, extra

    def response(self) -> JSONResponse:
        """The answer: status, headers and a problem+json body."""
        body: dict[str, Any] = {"type": "about:blank", "title": self.title,
                                "status": self.status}
        if self.detail:
            body["detail"] = self.detail
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return JSONResponse(body, status_code=self.status, headers=self.headers,
                            media_type=PROBLEM_JSON)


def bad_field(field: str, detail: str) -> Problem:
    """``400``: field ``field`` of the request is missing or malformed."""
    return Problem(400, "invalid request", f"{field}: {detail}", field=field)


def bad_fields(found: Sequence[tuple[str, str]]) -> Problem:
    """``400`` naming every bad field of a request: ``found`` is (field, message) pairs.

    ``field`` and ``detail`` are the first one's (as :func:`bad_field`); ``errors``
    lists them all, each ``{"field", "message"}``, so a client fixes them in one go.
    """
    field, message = found[0]
    problem = bad_field(field, message)
    problem.extra.update(errors=[{"field": f, "message": m} for f, m in found],
                         error_count=len(found))
    return problem


def invalid_job(exc: ValidationError, others: Sequence[ValidationError] = ()) -> Problem:
    """``400`` for a definition :meth:`Job.from_dict` refused: the field, and the row if any.

    ``others``: the errors of the definition's other fields; ``errors`` lists ``exc``
    and them, each ``{"field", "message", "error"}``.
    """
    extra: dict[str, Any] = {"row": exc.row} if exc.row is not None else {}
    everything = [exc, *others]
    extra.update(errors=[{"field": e.field, "message": e.message, "error": str(e)}
                         for e in everything], error_count=len(everything))
    return Problem(400, "invalid job", str(exc), field=exc.field, **extra)
