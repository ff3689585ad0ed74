"""Structured log events (``job_complete``, ``job_error``, ``poll_stats``, ...)."""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger("celery_zsched")


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``event`` followed by its fields as one JSON object.

    The fields are also attached to the record (``record.zsched_event`` and
    ``record.zsched``) for JSON log formatters.
    """
    if logger.isEnabledFor(level):
        logger.log(level, "%s %s", event, json.dumps(fields, separators=(",", ":"), default=str),
                   extra={"zsched_event": event, "zsched": fields})
