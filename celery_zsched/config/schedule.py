"""When and how often jobs run: batches, leases and deadlines, retries, caps."""

from __future__ import annotations

from dataclasses import dataclass

from celery_zsched.config.load import SETTING_PREFIX, check_not_negative, check_positive
from celery_zsched.core.errors import ConfigurationError


@dataclass(frozen=True)
class ScheduleSettings:
    """Beat's batches, the delivery contract's deadlines, retries and the store's caps."""

    #: Most jobs one claim takes (and one publish batch sends).
    batch_size: int = 1000
    #: Execution lease: seconds a started task may go without a worker heartbeat
    #: before it is presumed crashed and redelivered. Workers beat every third of it,
    #: and hold the messages they received but did not start under the same lease.
    lease_s: float = 30.0
    #: Publish deadline: seconds a claimed occurrence may wait for beat to confirm
    #: its publish; past it (beat died between claim and publish) it is due again.
    publish_timeout_s: float = 30.0
    #: Delivery deadline: seconds a published message may wait unstarted while a
    #: worker is alive before it is presumed lost by the broker and republished.
    delivery_timeout_s: float = 7200.0
    #: Most occurrences published and not yet started, all queues together (the
    #: total cap of backpressure); past it, due jobs wait in the schedule, not in
    #: the broker. 0: 10 x batch_size.
    max_queued: int = 0
    #: Most occurrences of one queue published and not yet started (backpressure
    #: per queue); past it, that queue's due jobs wait in the schedule, held back,
    #: while beat keeps promoting the other queues' jobs. 0: a fifth of the total
    #: cap, so five queues whose workers are all down leave it unreached.
    queue_max_queued: int = 0
    #: Default ``jitter_s`` of jobs that do not set their own.
    max_jitter_s: float = 0.0
    #: Interval of jobs that give no timing at all (for example a bare URL row).
    default_interval_s: float = 300.0
    #: Task that URL jobs run, called as ``task(url=..., meta=...)``.
    default_task: str = "scrape"
    #: Retries after an error before the job waits for its next regular run.
    retry_max: int = 3
    #: First retry delay; each further retry doubles it.
    retry_base_s: float = 30.0
    #: Largest retry delay.
    retry_cap_s: float = 3600.0
    #: Crashed executions of one occurrence (execution leases that ended with no
    #: settle) before it is dead-lettered. Waiting never counts.
    max_deliveries: int = 5
    #: Default ``misfire_grace_s``: skip a fire later than this. 0 never skips.
    misfire_grace_s: float = 0.0
    #: Freshness target of adaptive-recrawl jobs that set none: the expected share
    #: of time their copy equals the page (0-1, exclusive; see the Recrawl policy page).
    freshness_target: float = 0.8
    #: Adaptive-recrawl jobs take their interval from Cho's budget allocation: the
    #: capacity planner spends each paced domain's capacity where it buys the most
    #: freshness (a multiplier per domain, see the Recrawl policy page); a domain
    #: without one yet falls back to the freshness target.
    recrawl_allocation: bool = False
    #: Approximate cap of the settle event stream.
    events_maxlen: int = 100_000
    #: Approximate cap of each partition's audit stream (changes to jobs, see the
    #: README's "Operating it: audit trail"); 0 records no changes.
    audit_maxlen: int = 100_000
    #: Seconds a versioned delete (the Django outbox) keeps its tombstone, so an
    #: older write that arrives late cannot bring the job back.
    tombstone_ttl_s: float = 86_400.0
    #: Rows per pipelined chunk in bulk imports.
    import_chunk: int = 5000

    @property
    def queued_bound(self) -> int:
        """The backpressure bound in force (``max_queued``, or 10 x ``batch_size``)."""
        return self.max_queued or 10 * self.batch_size

    @property
    def queue_bound(self) -> int:
        """The per-queue backpressure bound in force (``queue_max_queued``, or a fifth
        of ``queued_bound``)."""
        return self.queue_max_queued or max(1, self.queued_bound // 5)

    @property
    def heartbeat_s(self) -> float:
        """How often workers extend their execution leases: a third of the lease."""
        return self.lease_s / 3

    def _check_schedule(self) -> None:
        check_positive(self, "batch_size", "lease_s", "publish_timeout_s", "delivery_timeout_s",
                       "default_interval_s", "retry_base_s", "retry_cap_s", "max_deliveries",
                       "events_maxlen", "import_chunk", "tombstone_ttl_s")
        check_not_negative(self, "max_jitter_s", "retry_max", "misfire_grace_s", "max_queued",
                           "queue_max_queued", "audit_maxlen")
        if self.queue_max_queued > self.queued_bound:
            # A queue's bound above the total cap could never be reached: say so
            # rather than let the setting mean something it cannot.
            raise ConfigurationError(
                f"{SETTING_PREFIX}queue_max_queued ({self.queue_max_queued}) must not exceed "
                f"the total cap {SETTING_PREFIX}max_queued ({self.queued_bound}"
                f"{'' if self.max_queued else ': 10 x batch_size'})")
        if not 0 < self.freshness_target < 1:
            raise ConfigurationError(f"zsched_freshness_target: must be between 0 and 1 "
                                     f"(exclusive), got {self.freshness_target!r}")
