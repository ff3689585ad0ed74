"""robots.txt in the worker: ``allowed(url)`` for tasks, and the check before each run.

With ``zsched_robots = True`` every occurrence of a job with an http(s) URL is
checked at start, after the start compare-and-set and before the task's body:
a URL its origin's robots.txt disallows is not fetched. The occurrence is
settled ``blocked_by_robots`` and the job waits its ``max_interval_s``, else
``zsched_robots_block_s`` (a day); while the robots.txt is unreachable, until it
is tried again. Tasks that fetch other URLs than their job's ask
:func:`allowed` themselves.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import current_app

from celery_zsched.core.domains import domain_of
from celery_zsched.core.job import Job
from celery_zsched.core.telemetry import log_event
from celery_zsched.services.appstore import store_for_app
from celery_zsched.services.robots import RobotsGuard, Verdict
from celery_zsched.store import StartResult, Store
from celery_zsched.worker.headers import Occurrence
from celery_zsched.worker.settle import settle_occurrence

__all__ = ["allowed", "check", "guard_for", "permit"]

_lock = threading.Lock()
_guards: dict[int, RobotsGuard] = {}


def guard_for(store: Store) -> RobotsGuard:
    """This process's :class:`RobotsGuard` of ``store`` (it keeps parsed entries)."""
    with _lock:
        guard = _guards.get(id(store))
        if guard is None or guard.store is not store:
            guard = _guards[id(store)] = RobotsGuard(store)
        return guard


def check(url: str, app: Any = None) -> Verdict:
    """The robots.txt verdict on ``url`` (fetching the origin's file if no worker has
    in the last ``zsched_robots_ttl_s``), whether or not ``zsched_robots`` is on."""
    store = store_for_app(app or current_app)
    settings = store.settings
    try:
        domain = (domain_of(url, group_registrable=settings.domain_registrable)
                  if settings.pacing else None)
    except ValueError:  # not a host a job could be paced under: no Crawl-delay to record
        domain = None
    return guard_for(store).check(url, domain)


def allowed(url: str, app: Any = None) -> bool:
    """Whether the origin's robots.txt lets ``url`` be fetched (see :func:`check`)."""
    return check(url, app).allowed


def permit(app: Any, occ: Occurrence, request: Any, result: StartResult) -> bool:
    """Whether the started occurrence may run; if robots.txt disallows its URL,
    settle it ``blocked_by_robots`` (under the start's fence) and say no."""
    store = store_for_app(app)
    if not store.settings.robots or result.definition is None:
        return True
    job = Job.from_json(result.definition)
    if not job.url:
        return True
    verdict = guard_for(store).check(job.url, job.pacing_domain(store.settings))
    if verdict.allowed:
        return True
    wait = verdict.retry_s
    if wait is None:
        wait = getattr(job, "max_interval_s", None)
    log_event("job_blocked_by_robots", logging.WARNING, job_id=occ.job_id,
              occurrence=occ.occurrence, url=job.url, reason=verdict.reason, retry_s=wait)
    settle_occurrence(app, occ, "blocked", request, f"robots.txt: {verdict.reason} {job.url}",
                      wait, request.id)
    return False
