"""The audit trail in Django: who is acting, and the change history copied from Redis.

Every change is recorded once, in Redis, by the script that makes it (see
:mod:`celery_zsched.core.audit`), whatever made it: the admin, a management
command, the CLI, reconcile. :func:`drain_changes` copies new entries into
:class:`ZSchedJobChange` rows, the way :mod:`.history` copies settles: one
``bulk_create`` per batch, then a cursor kept in Redis. The stream id is unique
in the table, so a batch drained twice adds nothing. Writing admin edits to the
table directly as well would record them twice, and with a diff against the
form rather than against what Redis really replaced.

Saves go to Redis after the transaction commits (:mod:`.signals`), when the
request that made them may be gone: :func:`acting` names the actor for the
saves made inside it, and the signal handlers bind it to their callbacks.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import transaction
from django.http import HttpRequest

from celery_zsched.contrib.django.conf import get_store
from celery_zsched.contrib.django.models import ZSchedJobChange, to_db_datetime
from celery_zsched.contrib.django.sync import IN_CHUNK, batched
from celery_zsched.core import audit
from celery_zsched.core.audit import Actor, Change, check_note
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.store import Store, audit_log

#: Stream entries read per round trip and written per transaction.
BATCH = 1000
#: Most pending entries a job's change page copies before it shows the trail.
PAGE_DRAIN = 5000

_ACTING: contextvars.ContextVar[tuple[Actor, str] | None] = contextvars.ContextVar(
    "zsched_acting", default=None)


@contextlib.contextmanager
def acting(by: Actor, note: str = "") -> Iterator[None]:
    """Record the changes made inside this block as made ``by``, with ``note``."""
    token = _ACTING.set((by, note))
    try:
        yield
    finally:
        _ACTING.reset(token)


def current() -> tuple[Actor, str]:
    """The actor and note of the innermost :func:`acting` block (default: ``api``)."""
    return _ACTING.get() or (audit.API, "")


def request_note(request: HttpRequest) -> str:
    """The note the admin user typed with an action or a button ("" if none); raises
    :class:`~celery_zsched.core.errors.ValidationError` (field ``note``) when it is too long,
    for the view to show as an error message, before anything changes."""
    return check_note(str(request.POST.get("note", "")))


def admin_actor(request: HttpRequest) -> Actor:
    """The admin user of ``request``."""
    user = getattr(request, "user", None)
    return Actor("admin", user.get_username() if user is not None else "")


# --------------------------------------------------------------------- drain
@dataclass
class ChangeDrainReport:
    """What :func:`drain_changes` did."""

    read: int = 0
    created: int = 0
    seconds: float = 0.0


def drain_changes(max_items: int = 100_000, *, batch: int = BATCH) -> ChangeDrainReport:
    """Copy up to ``max_items`` new audit entries into :class:`ZSchedJobChange`; idempotent.

    Raises :class:`~celery_zsched.core.errors.StoreUnavailable` if Redis is down.
    """
    started = time.perf_counter()
    store = get_store()
    report = ChangeDrainReport()
    for part in range(store.partitions):
        _drain_part(store, part, max_items, batch, report)
    report.seconds = time.perf_counter() - started
    return report


def _drain_part(store: Store, part: int, max_items: int, batch: int,
                report: ChangeDrainReport) -> None:
    # Entry ids repeat across partitions' streams: with several, a row's
    # stream_id is "partition/entry id".
    label = f"{part}/" if store.partitions > 1 else ""
    cursor = audit_log.cursor(store, part)
    while report.read < max_items:
        rows = audit_log.entries(store, after=cursor, count=min(batch, max_items - report.read),
                             part=part)
        if not rows:
            return
        with transaction.atomic():
            # "drained": copied by zsched repartition from a stream drained before.
            report.created += _record([Change.from_entry(label + sid, fields)
                                       for sid, fields in rows if "drained" not in fields])
        # The cursor moves only after the rows are committed: a crash in between
        # re-reads entries whose rows exist, which the unique stream_id absorbs.
        cursor = rows[-1][0]
        audit_log.advance_cursor(store, cursor, part)
        report.read += len(rows)


def _record(changes: list[Change]) -> int:
    seen: set[str] = set()
    for part in batched([c.stream_id for c in changes], IN_CHUNK):
        seen.update(ZSchedJobChange.objects.filter(stream_id__in=part)
                    .values_list("stream_id", flat=True))
    rows = [ZSchedJobChange(job_id=c.job_id, at=to_db_datetime(c.at_ms),
                            actor_kind=c.actor.kind, actor_name=c.actor.name,
                            action=c.action, diff=c.diff, note=c.note, stream_id=c.stream_id)
            for c in changes if c.stream_id not in seen and not c.empty]
    # ignore_conflicts too: a concurrent drain may insert the same entries now.
    ZSchedJobChange.objects.bulk_create(rows, batch_size=500, ignore_conflicts=True)
    return len(rows)


def drain_quietly(max_items: int = PAGE_DRAIN) -> None:
    """:func:`drain_changes`, for a page about to show the trail: Redis down shows
    what the table has."""
    with contextlib.suppress(StoreUnavailable):
        drain_changes(max_items)
