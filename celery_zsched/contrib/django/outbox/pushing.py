"""Pushing changes to Redis, versioned, and confirming what Redis took."""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import redis
from django.db import DatabaseError, router, transaction
from django.db.models import Q

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedOutbox
from celery_zsched.contrib.django.outbox.recording import DELETE, SAVE
from celery_zsched.contrib.django.sync import batched
from celery_zsched.core.audit import Actor
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.store import Store

logger = logging.getLogger("celery_zsched.django")

#: Bound parameters per DELETE of confirmed entries (well under SQLite's 999).
CONFIRM_PARAMS = 800


@dataclass(frozen=True)
class Change:
    """What Redis must hold for one job, at one version.

    ``save`` writes ``job`` (``None``: the row is invalid, so the change waits
    in the outbox, where failed attempts are counted); ``pause`` and ``resume``
    change only the paused state (``job``, when known, creates the job if
    Redis does not have it); ``delete`` leaves a tombstone.
    """

    job_id: str
    version: int
    action: str
    job: Job | None = None
    by: Actor = field(default_factory=Actor)
    note: str = ""
    #: Why ``job`` is missing (an invalid row), for the entry's last error.
    error: str = ""


@dataclass
class Sent:
    """What :func:`send` achieved: jobs Redis now holds, and jobs that failed by their fault."""

    done: list[Change] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def send(store: Store, changes: Sequence[Change]) -> Sent:
    """Push ``changes`` to Redis, versioned: one call per action and actor, not per job.

    A change that Redis holds a newer version of counts as done: the newer one
    is what counts. A job a pause or resume did not find in Redis is created
    from its definition when the change carries one, else left pending. Raises
    :class:`StoreUnavailable` when Redis cannot be reached (nothing is then
    counted against any change).
    """
    sent = Sent()
    groups: dict[tuple[str, Actor, str], list[Change]] = defaultdict(list)
    for change in changes:
        if change.action == SAVE and change.job is None:
            sent.failed[change.job_id] = change.error or "the row is invalid"
        else:
            groups[(change.action, change.by, change.note)].append(change)
    for (action, by, note), group in groups.items():
        try:
            _send_group(store, action, by, note, group, sent)
        except redis.ResponseError as exc:
            if isinstance(exc, redis.exceptions.OutOfMemoryError) \
                    or str(exc).startswith("BUSY"):
                # Redis as a whole refuses for now (out of memory, a busy script):
                # an outage, never a change's fault.
                raise StoreUnavailable(f"Redis refuses writes for now: {exc}") from exc
            if len(group) == 1:
                sent.failed[group[0].job_id] = f"Redis refused it: {exc}"
                continue
            for change in group:  # find the one(s) at fault
                one = send(store, [change])
                sent.done += one.done
                sent.failed.update(one.failed)
    return sent


def _send_group(store: Store, action: str, by: Actor, note: str, group: list[Change],
                sent: Sent) -> None:
    versions = {c.job_id: c.version for c in group}
    if action == SAVE:
        jobs = [c.job for c in group if c.job is not None]
        report = store.upsert_many(jobs, stagger=True, by=by, note=note, versions=versions)
        # A domain change that waits for an occurrence in flight stays pending.
        waiting = set(report.deferred_ids)
        sent.done += [c for c in group if c.job_id not in waiting]
        return
    reply = store.control(action, [c.job_id for c in group], versions=versions, by=by,
                          note=note)
    missing = set(reply.missing) if action != DELETE else set()
    create = [c for c in group if c.job_id in missing and c.job is not None]
    deferred: set[str] = set()
    if create:
        deferred = set(store.upsert_many(
            [c.job for c in create if c.job is not None], stagger=True, by=by, note=note,
            versions={c.job_id: c.version for c in create}).deferred_ids)
    sent.done += [c for c in group if (c.job_id not in missing or c.job is not None)
                  and c.job_id not in deferred]


def confirm(changes: Iterable[Change], using: str | None = None) -> int:
    """Delete the outbox entries Redis now holds: each job's, up to its pushed version.

    Dead-lettered entries of the job go too: the pushed version supersedes
    them. Changes of one version share one ``job_id IN (...)`` statement, so a
    bulk change of 100,000 rows costs one DELETE per 800 of them.
    """
    latest: dict[str, int] = {}
    for change in changes:
        latest[change.job_id] = max(latest.get(change.job_id, 0), change.version)
    by_version: dict[int, list[str]] = defaultdict(list)
    for job_id, version in latest.items():
        by_version[version].append(job_id)
    deleted, terms, params = 0, Q(), 0
    manager = ZSchedOutbox.objects.using(using or router.db_for_write(ZSchedOutbox))
    for version, ids in by_version.items():
        for part in batched(ids, CONFIRM_PARAMS):
            terms |= Q(id__lte=version, job_id__in=part)
            params += len(part) + 1
            if params >= CONFIRM_PARAMS:
                deleted += manager.filter(terms).delete()[0]
                terms, params = Q(), 0
    if params:
        deleted += manager.filter(terms).delete()[0]
    return deleted


def push(changes: Sequence[Change], using: str | None = None) -> bool:
    """Send ``changes`` now and confirm what Redis took; False if any is left to the sweeper.

    Failures are logged, never raised: the changes are saved, and their outbox
    entries stay until the sweeper in beat delivers them.
    """
    try:
        sent = send(get_store(), changes)
    except StoreUnavailable as exc:
        logger.warning("zsched: Redis not updated for job %s (%s); the change is kept in the "
                       "outbox and retried by beat as soon as Redis is reachable",
                       changes[0].job_id if changes else "-", exc)
        return False
    try:
        confirm(sent.done, using)
    except DatabaseError as exc:  # Redis has it: a sweep will find it there and confirm it
        logger.warning("zsched: could not confirm %d pushed change(s): %s", len(sent.done), exc)
    for job_id, error in list(sent.failed.items())[:5]:
        logger.error("zsched: job %s not sent to Redis (%s); kept in the outbox", job_id, error)
    return not sent.failed and len(sent.done) == len(changes)


def push_after_commit(changes: Sequence[Change], *, using: str) -> None:
    """Push ``changes`` when the current transaction commits (at once outside of one)."""
    if changes:
        transaction.on_commit(functools.partial(push, list(changes), using), using=using)

