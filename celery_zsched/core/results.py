"""What the store's operations return: claimed occurrences, reports and results."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.recrawl import Visit
from celery_zsched.core.state import RuntimeState

#: Namespace of the deterministic Celery task ids: uuid5(ns, "job:occurrence:attempt").
TASK_ID_NAMESPACE = uuid.UUID("5b0c2f64-2c51-4f0e-9d0b-0d5c3f1e7a11")

def task_id_for(job_id: str, occurrence: int, attempt: int) -> str:
    """The Celery task id of one attempt of one occurrence; a redelivery reuses it.

    ``str(uuid.uuid5(TASK_ID_NAMESPACE, "job:occurrence:attempt"))``, written out:
    beat names every message it publishes, and ``UUID`` objects cost more than the hash.
    """
    digest = hashlib.sha1(_NAMESPACE + f"{job_id}:{occurrence}:{attempt}".encode()).digest()
    value = int.from_bytes(digest[:16], "big") & _VERSION_MASK | _VERSION_5
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_NAMESPACE = TASK_ID_NAMESPACE.bytes
#: The bits a version 5 UUID sets: its version (4 bits) and the RFC 4122 variant (2 bits).
_VERSION_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_5 = (5 << 76) | (0x8000 << 48)


@dataclass(frozen=True)
class Claimed:
    """One claimed occurrence, ready to publish."""

    job: Job
    occurrence: int
    attempt: int
    #: How many times this occurrence and attempt has been published (1 = first).
    deliveries: int
    due_ms: int
    promoted_ms: int
    #: The holder's number: the gateway's claim numbers each hand-out so, and its
    #: lease token carries it (fencing). 0 for beat's claims: a worker's start
    #: numbers the execution instead.
    fence: int = 0
    #: Where it was claimed, as ``"index@layout"`` (``""``: placed by id, which needs
    #: no hint): the worker finds the job's partition without the directory.
    partition: str = ""
    #: The last visit's ``etag``, ``last_modified`` and ``signature`` (those stored):
    #: what a conditional fetch sends.
    validators: dict[str, str] = field(default_factory=dict)

    @property
    def republished(self) -> bool:
        """Whether this publish is a second or later one of its occurrence and attempt
        (recovered from a dead process or a lost message): it goes to the front of
        its Redis list (:mod:`celery_zsched.beat.envelope`)."""
        return self.deliveries > 1

    @property
    def task_id(self) -> str:
        """Deterministic task id of this attempt."""
        return task_id_for(self.job.id, self.occurrence, self.attempt)

    def headers(self) -> dict[str, Any]:
        """Message headers that let the worker settle this occurrence."""
        headers: dict[str, Any] = {
            "zsched_job_id": self.job.id,
            "zsched_occurrence": self.occurrence,
            "zsched_attempt": self.attempt,
            "zsched_due_ms": self.due_ms,
            "zsched_promoted_ms": self.promoted_ms,
            # Which publish of this attempt the message is: start accepts only one
            # that was made (1..publishes), so a forged or stray message never runs.
            "zsched_delivery": self.deliveries,
        }
        if self.partition:
            headers["zsched_partition"] = self.partition
        if self.job.expires_s is not None:
            # Checked by the worker's start against Redis' clock, never a host's.
            headers["zsched_expires_ms"] = round(self.job.expires_s * 1000)
        for name, value in self.validators.items():
            headers[f"zsched_{name}"] = value
        return headers


@dataclass(frozen=True)
class ClaimBatch:
    """The result of one claim: the jobs, and when the next ones are due."""

    now_ms: int
    next_due_ms: int | None
    #: The earliest delivery deadline or execution lease deadline.
    next_lease_ms: int | None
    jobs: list[Claimed]
    #: Occurrences that may still be queued before backpressure holds jobs back.
    room: int = 1
    #: Due jobs pacing held back (moved to their domain's next free slot).
    held: int = 0
    #: Due jobs held back because their queue was at its bound (backpressure per queue).
    queue_held: int = 0

    @property
    def taken(self) -> int:
        """Due jobs this claim dealt with: claimed or held back."""
        return len(self.jobs) + self.held + self.queue_held


def merge_batches(batches: Iterable[ClaimBatch]) -> ClaimBatch:
    """One batch from the claims of several partitions: their jobs, the earliest
    next due time and deadline, and the room left in all of them."""
    parts = list(batches)
    dues = [b.next_due_ms for b in parts if b.next_due_ms is not None]
    leases = [b.next_lease_ms for b in parts if b.next_lease_ms is not None]
    return ClaimBatch(max((b.now_ms for b in parts), default=0), min(dues, default=None),
                      min(leases, default=None), [j for b in parts for j in b.jobs],
                      sum(b.room for b in parts), sum(b.held for b in parts),
                      sum(b.queue_held for b in parts))


@dataclass(frozen=True)
class JobInfo:
    """A job's definition with its live timing state."""

    job: Job
    status: str
    due_ms: int | None
    #: Execution lease deadline while running, delivery deadline while queued.
    lease_until_ms: int | None
    paused: bool
    state: RuntimeState = field(default_factory=RuntimeState)
    #: :func:`~celery_zsched.core.job.definition_tag` of the stored definition.
    tag: str = ""

    @property
    def next_run_ms(self) -> int | None:
        """When it runs next (``None`` when paused, finished, dead or in flight)."""
        return self.due_ms


@dataclass
class ImportReport:
    """What a bulk upsert did."""

    total: int = 0
    created: int = 0
    updated: int = 0
    rescheduled: int = 0
    #: Rows not written because their ``expect`` did not hold (see :meth:`Store.upsert`).
    skipped: int = 0
    seconds: float = 0.0
    #: Versioned rows not written because Redis holds a newer version of the job
    #: (or of its delete): see ``versions`` of :meth:`Store.upsert_many`.
    stale: int = 0
    #: Rows not written because their new domain moves the job to another partition
    #: while an occurrence of it is in flight (pacing on several partitions):
    #: store them again once it has settled.
    deferred: int = 0
    #: The ids of those rows.
    deferred_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OutboxReport:
    """The Django outbox as its sweeper last reported it (:meth:`Store.outbox_report`)."""

    #: Redis' clock when this was read (ms).
    now_ms: int
    #: Changes saved in the database and not in Redis yet, and those dead-lettered.
    pending: int = 0
    dead: int = 0
    #: Age of the oldest pending change when reported, and when that was (Redis ms;
    #: ``None``: no sweeper ever reported).
    oldest_age_ms: int = 0
    reported_ms: int | None = None

    @property
    def oldest_age_now_ms(self) -> int:
        """Age of the oldest pending change now: a report that stops coming keeps ageing."""
        if not self.pending or self.reported_ms is None:
            return 0
        return self.oldest_age_ms + max(0, self.now_ms - self.reported_ms)


@dataclass(frozen=True)
class StartResult:
    """What a worker's start found: ``status`` is ``ok`` only for the one delivery that runs.

    ``expired`` means the message waited longer than the job's ``expires_s``
    (on Redis' clock); ``duplicate`` that the occurrence is running or settled
    already; ``stale`` that it is not the job's current occurrence; ``gone``
    that the job and its state no longer exist. With pacing, ``wait`` means
    the domain's gate opens in ``until_ms`` ms (start again then), and
    ``deferred`` that the occurrence went back to the schedule, due at
    ``until_ms``, because the gate stays closed longer than a worker waits.
    ``refused`` means the message was never promoted so (``reason``
    ``unpromoted``: its delivery number is not one beat published for this
    attempt) or names another task than the one it was published under
    (``task``; ``found`` is that task).
    """

    status: str
    now_ms: int | None = None
    due_ms: int | None = None
    promoted_ms: int | None = None
    found: str = ""
    until_ms: int | None = None
    #: The number of this execution (``ok``): heartbeat, retry and settle present it.
    fence: int | None = None
    reason: str = ""
    #: The job's definition JSON as the start found it (``ok``; None if deleted): the
    #: settle computes the next run from it without reading it again.
    definition: str | None = None

    @property
    def runs(self) -> bool:
        """Whether this delivery runs the task."""
        return self.status == "ok"


@dataclass(frozen=True)
class ReapResult:
    """What one reap did."""

    #: Executions whose lease ended with no heartbeat, made due again.
    redelivered: int = 0
    #: Occurrences dead-lettered after ``max_deliveries`` crashes.
    dead: int = 0
    #: Messages presumed lost by the broker (a worker was alive), republished.
    lost: int = 0
    #: Messages past their delivery deadline while no worker was alive: kept waiting.
    held: int = 0
    #: Entries promoted before execution leases existed, converted to queued.
    converted: int = 0
    #: Messages a worker received and held, then died before starting: made due again.
    orphaned: int = 0
    #: Occurrences claimed by a beat that died before confirming the publish: due again.
    unpublished: int = 0
    #: Ids redelivered, republished or dead-lettered.
    ids: tuple[str, ...] = ()
    #: Of ``ids``, the ones dead-lettered.
    dead_ids: tuple[str, ...] = ()

    @classmethod
    def merge(cls, results: Iterable[ReapResult]) -> ReapResult:
        """The sum of several partitions' reaps."""
        parts = list(results)
        return cls(
            redelivered=sum(r.redelivered for r in parts), dead=sum(r.dead for r in parts),
            lost=sum(r.lost for r in parts), held=sum(r.held for r in parts),
            converted=sum(r.converted for r in parts), orphaned=sum(r.orphaned for r in parts),
            unpublished=sum(r.unpublished for r in parts),
            ids=tuple(i for r in parts for i in r.ids),
            dead_ids=tuple(i for r in parts for i in r.dead_ids))

    @property
    def total(self) -> int:
        """Occurrences that went back to the schedule or died."""
        return self.redelivered + self.dead + self.lost + self.orphaned + self.unpublished


@dataclass(frozen=True)
class SettleResult:
    """What a settle did: ``applied`` is False for stale or duplicate settles."""

    applied: bool
    status: str
    label: str
    next_due_ms: int | None = None
    now_ms: int | None = None
    #: Errors in a row after this settle (0 after a success; 0 when not applied).
    consecutive_failures: int = 0
    #: The domain whose breaker this settle opened (closed -> open), if any.
    breaker_opened: str | None = None
    #: The definition the settle read (``None`` for a deleted job).
    job: Job | None = None


@dataclass(frozen=True)
class SettleReport:
    """One outcome to settle: what :meth:`Store.settle` takes, as a value
    (:meth:`Store.settle_many` takes many)."""

    job_id: str
    occurrence: int
    attempt: int
    #: ``complete`` | ``error`` | ``skip``.
    outcome: str
    error: str = ""
    retry_after_s: float | None = None
    #: The run's timings, recorded with the settle event.
    event: dict[str, Any] | None = None
    http_status: int | None = None
    fence: int | None = None
    delivery: int | None = None
    #: What the fetch saw of the page (change-aware recrawl), if it said.
    visit: Visit | None = None


@dataclass(frozen=True)
class NoticeGate:
    """What the notifiers' shared rate limit and digest said (``notify.lua``)."""

    #: ``send`` | ``limited`` | ``held`` (kept for the digest) | ``flush``.
    verdict: str
    #: End of the open digest window that holds notices (Redis ms), or None.
    open_until_ms: int | None
    now_ms: int
    #: A closed window's digest this call claimed (only this caller got it), or None.
    digest: dict[str, Any] | None = None
