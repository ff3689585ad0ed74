"""Publish a claimed batch as Celery messages, pipelined where the broker allows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .store import Claimed


def message_args(claimed: Claimed) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of a job's task.

    A URL job's task receives ``url=`` and ``meta=`` (plus any kwargs of its own).
    """
    job = claimed.job
    kwargs = dict(job.kwargs)
    if job.url is not None:
        kwargs["url"] = job.url
        kwargs["meta"] = job.meta
    return list(job.args), kwargs


def routing_options(claimed: Claimed) -> dict[str, Any]:
    """The job's queue, routing key, priority and expiry, as ``send_task`` options."""
    job = claimed.job
    options: dict[str, Any] = {}
    if job.queue:
        options["queue"] = job.queue
    if job.routing_key:
        options["routing_key"] = job.routing_key
    if job.priority is not None:
        options["priority"] = job.priority
    if job.expires_s is not None:
        options["expires"] = job.expires_s
    return options


def publish_batch(app: Any, producer: Any, jobs: Sequence[Claimed]) -> None:
    """Send every job through one producer.

    Inside ``Producer.batch()`` kombu's Redis transport buffers the LPUSHes in
    one pipeline, so a batch costs one broker round trip; other transports
    publish immediately. Each message has a deterministic task id and headers
    that let the worker settle it.
    """
    if not jobs:
        return
    batch = producer.batch(max_size=max(1, len(jobs))) if hasattr(producer, "batch") else None
    if batch is None:
        for claimed in jobs:
            _send(app, producer, claimed)
        return
    with batch:
        for claimed in jobs:
            _send(app, producer, claimed)


def _send(app: Any, producer: Any, claimed: Claimed) -> None:
    args, kwargs = message_args(claimed)
    app.send_task(
        claimed.job.task, args=args, kwargs=kwargs, task_id=claimed.task_id,
        headers=claimed.headers(), producer=producer, **routing_options(claimed),
    )
