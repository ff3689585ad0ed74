"""The Celery app that the end-to-end tests run as real beat and worker processes.

Everything is configured from the environment the test sets: the broker
(``E2E_BROKER_URL``), the queue (``E2E_QUEUE``), the static ``beat_schedule``
(``E2E_BEAT_SCHEDULE``, JSON) and every ``ZSCHED_*`` setting override (store URL,
key prefix, lease, retry policy, ...).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery import Celery, Task

import celery_zsched.worker  # installs the settle hooks
from celery_zsched.core.errors import JobFailed
from celery_zsched.core.http_status import parse_retry_after
from tests.e2e.names import (
    ENV_ACKS_LATE,
    ENV_BEAT_DIE_AFTER_S,
    ENV_BEAT_SCHEDULE,
    ENV_BROKER_URL,
    ENV_HTTP_TIMEOUT_S,
    ENV_QUEUE,
    ENV_SPANS_FILE,
    ENV_START_DELAY_S,
    ENV_WORKER_ID,
    OTHER_TASK,
    SCRAPE_TASK,
    START_DELAYED,
    TASK_ID_PARAM,
    WORKER_ID_PARAM,
)

app = Celery("e2e")
app.conf.update(
    broker_url=os.environ[ENV_BROKER_URL],
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ[ENV_QUEUE],
    task_ignore_result=True,
    # Early ack (Celery's default), so a worker killed mid-task loses the
    # message: only the zsched lease can bring the occurrence back. A test sets
    # E2E_ACKS_LATE=1 where the late ack is the point.
    task_acks_late=os.environ.get(ENV_ACKS_LATE) == "1",
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    timezone="UTC",
    beat_schedule=json.loads(os.environ.get(ENV_BEAT_SCHEDULE) or "{}"),
    zsched_default_task=SCRAPE_TASK,
)
if os.environ.get(ENV_SPANS_FILE):
    # zsched_tracing (ZSCHED_TRACING) finds this provider: beat's, the worker's
    # pool processes' (inherited through the fork) and the server's spans.
    from tests.spans import export_to

    export_to(os.environ[ENV_SPANS_FILE])

if os.environ.get(ENV_BEAT_DIE_AFTER_S):
    from celery_zsched.beat.scheduler import ZSchedScheduler

    _DIE_AT = time.monotonic() + float(os.environ[ENV_BEAT_DIE_AFTER_S])
    _publish = ZSchedScheduler._publish

    def _publish_or_die(self: ZSchedScheduler, jobs: Any) -> int:
        # Claimed, not yet published: the moment a beat crash costs the most.
        if jobs and time.monotonic() >= _DIE_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return _publish(self, jobs)

    ZSchedScheduler._publish = _publish_or_die  # type: ignore[method-assign]

if os.environ.get(ENV_START_DELAY_S):
    import sys

    from celery_zsched.worker import start as _start

    _start_occurrence = _start.start_occurrence

    def _start_late(task: Task[Any, Any]) -> None:
        # Accepted by this pool process, so acknowledged (early ack), not yet started.
        print(f"{START_DELAYED} {task.request.id}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ[ENV_START_DELAY_S]))
        _start_occurrence(task)

    _start.start_occurrence = _start_late


class TargetError(JobFailed):
    """The scrape target answered with a server error (HTTP 5xx).

    A :class:`JobFailed`, so it carries the status and the ``Retry-After`` (a
    503 may send one) that pacing learns from; its own name keeps the error
    text ("TargetError: HTTP 500 ...") telling a target's failure from others.
    """


def _retry_after(headers: Any) -> float | None:
    # A missing, unparsable or zero Retry-After means "none": the retry policy decides.
    return parse_retry_after(headers.get("Retry-After")) or None


def _with_task_id(url: str, task_id: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), (TASK_ID_PARAM, task_id),
             (WORKER_ID_PARAM, os.environ.get(ENV_WORKER_ID, ""))]
    return urlunsplit(parts._replace(query=urlencode(query)))


@app.task(name=SCRAPE_TASK, bind=True)
def scrape(self: Task[Any, Any], url: str, meta: dict[str, Any] | None = None) -> int:
    """Fetch ``url`` (tagged with this task's id and worker); a 5xx raises, a 429 reports a retry.

    Every outcome carries the HTTP status (and a 429's or 5xx's ``Retry-After``),
    as pacing needs it: an answer below 500 other than 429 completes with
    ``report("complete", status=...)``, a 5xx raises :class:`TargetError`.

    ``meta["on_429"]`` chooses how a 429 is reported: ``"report"`` calls
    :func:`celery_zsched.worker.report` and returns normally, ``"raise"`` raises
    :class:`celery_zsched.core.errors.JobFailed`. Either way ``Retry-After`` is the delay.
    ``meta["celery_retry_s"]`` makes the first try retry itself through Celery's
    own ``Task.retry`` with that countdown.
    """
    meta = meta or {}
    timeout = float(os.environ.get(ENV_HTTP_TIMEOUT_S, "60"))
    tagged = _with_task_id(url, str(self.request.id))
    # Conditional: the validators of the last visit, from the message's headers.
    request = urllib.request.Request(tagged, headers=celery_zsched.worker.validators())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
            status = int(resp.status)
            etag = resp.headers.get("ETag")
    except urllib.error.HTTPError as exc:
        retry_after = _retry_after(exc.headers)
        if exc.code == 429:
            if meta.get("on_429") == "raise":
                raise JobFailed(f"HTTP 429 from {url}", retry_after=retry_after,
                                status=429) from None
            celery_zsched.worker.report("error", error="HTTP 429", retry_after=retry_after,
                                        status=429)
            return exc.code
        if exc.code >= 500:
            raise TargetError(f"HTTP {exc.code} from {url}", retry_after=retry_after,
                              status=exc.code) from None
        celery_zsched.worker.report("complete", status=exc.code)
        return exc.code
    if meta.get("celery_retry_s") and not self.request.retries:
        raise self.retry(countdown=float(meta["celery_retry_s"]))
    celery_zsched.worker.report("complete", status=status, etag=etag,
                                changed=True if etag else None)
    return status


@app.task(name=OTHER_TASK)
def other(url: str, meta: dict[str, Any] | None = None) -> int:
    """Another task: it fetches ``url`` too, so a run of it would show at the target."""
    tagged = _with_task_id(url, "other")
    with urllib.request.urlopen(tagged, timeout=10) as resp:
        return int(resp.status)
