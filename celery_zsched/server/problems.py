"""Error answers: ``application/problem+json`` (RFC 9457) naming the field at fault."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ..errors import ValidationError

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


def invalid_job(exc: ValidationError) -> Problem:
    """``400`` for a definition :meth:`Job.from_dict` refused: the field, and the row if any."""
    extra: dict[str, Any] = {"row": exc.row} if exc.row is not None else {}
    return Problem(400, "invalid job", str(exc), field=exc.field, **extra)
