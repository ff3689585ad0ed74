"""Every Redis key name is built here, from one configurable prefix."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from celery_zsched.config.redis import DEFAULT_PREFIX

#: A job held back because its queue was at its backpressure bound stays in the
#: schedule scored ``PARK_BASE`` + its due time (``_prelude.lua`` has the same
#: number): past every real due time, in due order among the held.
PARK_BASE = 2**50


def due_of(score: float) -> int:
    """The due time (ms) of a schedule score, held back or not."""
    return int(score - PARK_BASE if score >= PARK_BASE else score)


def partition_of(job_id: str, count: int) -> int:
    """The partition that holds ``job_id`` in a store of ``count`` partitions.

    CRC-32 of the UTF-8 id: stable across processes, Python versions and
    languages (``hash()`` is salted per process), and cheap.
    """
    return zlib.crc32(job_id.encode("utf-8")) % count if count > 1 else 0


@dataclass(frozen=True)
class Keys:
    """The Redis keys of one store.

    The prefix carries a Redis Cluster hash tag, so every Lua script touches
    keys of a single slot.
    """

    prefix: str = DEFAULT_PREFIX

    @classmethod
    def for_prefix(cls, prefix: str) -> Keys:
        """Keys under ``prefix``; a prefix without a hash tag gets one."""
        if "{" not in prefix or "}" not in prefix:
            prefix = "{" + prefix.rstrip(":") + "}:"
        return cls(prefix)

    def partition(self, index: int, count: int) -> Keys:
        """The keys of partition ``index`` of ``count``, under this (base) prefix.

        One partition keeps the base prefix itself, so a store made before
        partitions existed is the one-partition store. With more, partition
        ``i`` of ``{zsched}:`` is ``{zsched:i}:``: its own hash tag, its own
        Redis Cluster slot.
        """
        if count <= 1:
            return self
        head, _, tail = self.prefix.partition("}")
        return Keys(f"{head}:{index}}}{tail}")

    def partitions(self, count: int) -> list[Keys]:
        """The keys of every partition of a ``count``-partition store."""
        return [self.partition(i, count) for i in range(max(1, count))]

    @property
    def layout(self) -> str:
        """String: the store's layout, on the base prefix (absent: 1): its partition
        count, and ``/domain`` or ``/registrable`` when paced jobs live in their
        domain's partition (``12/domain``).

        ``repartition`` writes it; every process checks the layout its own
        settings ask for against it before it touches a job.
        """
        return self._k("layout")

    @property
    def beats(self) -> str:
        """Sorted set, on the base prefix: beat name -> its last announcement (ms)."""
        return self._k("beats")

    def _k(self, name: str) -> str:
        return self.prefix + name

    @property
    def defs(self) -> str:
        """Hash: job id -> definition JSON."""
        return self._k("defs")

    @property
    def schedule(self) -> str:
        """Sorted set: job id -> due time (ms)."""
        return self._k("schedule")

    @property
    def http_schedule(self) -> str:
        """Sorted set: id -> due time (ms) of ``transport: http`` jobs.

        Beat's claim never reads it: only the job gateway claims from it, so
        HTTP jobs cost beat nothing however many there are.
        """
        return self._k("http_schedule")

    @property
    def http_wake(self) -> str:
        """Pub/sub channel: an HTTP job became due sooner (payload: its due ms).

        Not a key (nothing is stored under it); it shares the prefix so that
        every store has its own channel.
        """
        return self._k("http_wake")

    @property
    def queued(self) -> str:
        """Sorted set: job id -> delivery deadline (ms) while published and not started."""
        return self._k("queued")

    @property
    def queue_in_flight(self) -> str:
        """Hash: queue -> occurrences of that queue in ``queued`` (per-queue backpressure).

        An occurrence counts under the queue its state names (``bq``), set by the
        claim; every script that adds it to ``queued`` or takes it out keeps the
        count (``_prelude.lua``: ``queued_add``, ``queued_rem``).
        """
        return self._k("queue_in_flight")

    @property
    def received(self) -> str:
        """Hash: line (a queue and a priority: one broker list) -> the latest promotion
        time a start of that line saw. Every message of the line published well before
        it has left the broker's list (``lost.lua``)."""
        return self._k("received")

    @property
    def queue_held(self) -> str:
        """Hash: queue -> jobs the claim held back in the schedule because that queue
        was at its bound (parked past ``PARK_BASE``). The claim keeps it and corrects
        it whenever it reads every held-back job; a held job paused, deleted or run
        now meanwhile is counted until then."""
        return self._k("queue_held")

    @property
    def leases(self) -> str:
        """Sorted set: job id -> execution lease deadline (ms) while running."""
        return self._k("leases")

    @property
    def workers(self) -> str:
        """Sorted set: worker name -> its last heartbeat (ms)."""
        return self._k("workers")

    @property
    def state(self) -> str:
        """Hash: job id -> runtime state (cjson)."""
        return self._k("state")

    @property
    def paused(self) -> str:
        """Set of paused job ids."""
        return self._k("paused")

    @property
    def dead(self) -> str:
        """Sorted set: dead-lettered job id -> time it died (ms)."""
        return self._k("dead")

    @property
    def static(self) -> str:
        """Set of job ids that came from the ``beat_schedule`` setting."""
        return self._k("static")

    @property
    def events(self) -> str:
        """Capped stream of settles, for run history."""
        return self._k("events")

    @property
    def counters(self) -> str:
        """Hash of lifetime counters: ``promoted`` and ``started``; each settle's label
        (``complete``, ``error``, ...); and what the delivery contract caught
        (``redelivered``, ``orphaned``, ``unpublished``, ``lost``, ``duplicates``,
        ``refused``, ``deferred``, ``held``, ``dead``); ``queue_held``: due jobs
        held back because their queue was at its bound."""
        return self._k("counters")

    @property
    def drain_cursor(self) -> str:
        """String: id of the last settle event copied into the Django run history."""
        return self._k("drain_cursor")

    @property
    def domains(self) -> str:
        """Hash: domain -> its learned pacing state (cjson; see ``_prelude.lua``)."""
        return self._k("domains")

    @property
    def recrawl_mu(self) -> str:
        """Hash: domain -> the multiplier of Cho's budget allocation for its adaptive jobs
        (a float; the capacity planner writes it, ``settle.lua`` reads it)."""
        return self._k("recrawl_mu")

    @property
    def domain_conf(self) -> str:
        """Hash: domain -> the operator's overrides (JSON: delay ms, cap, adaptive)."""
        return self._k("domain_conf")

    @property
    def robots(self) -> str:
        """Hash, on the base prefix: origin (``scheme://host[:port]``) -> its robots.txt
        as last fetched (JSON: kind, body, fetched and expiry ms, status, error)."""
        return self._k("robots")

    @property
    def robots_claims(self) -> str:
        """Hash, on the base prefix: origin -> until when one worker's fetch of its
        robots.txt is under way (ms): the others wait for it or use the stale copy."""
        return self._k("robots:claims")

    @property
    def planner(self) -> str:
        """String, on the base prefix: the capacity planner's last result (JSON, with
        the Redis time it was computed)."""
        return self._k("planner")

    @property
    def planner_claim(self) -> str:
        """String, on the base prefix: held (expiring) while one process recomputes
        the planner, so the others read the last result instead of scanning too."""
        return self._k("planner:claim")

    @property
    def notify_limits(self) -> str:
        """Sorted set, on the base prefix: ``event|subject`` -> end of its notice
        rate limit (ms)."""
        return self._k("notify:limits")

    @property
    def notify_digest(self) -> str:
        """Hash, on the base prefix: the open digest window (start ms, notices counted,
        held, held per signal)."""
        return self._k("notify:digest")

    @property
    def notify_held(self) -> str:
        """List, on the base prefix: the notices held for the open digest (JSON, capped)."""
        return self._k("notify:held")

    def idempotency(self, digest: str) -> str:
        """String, on the base prefix: the first answer to a REST call with an
        ``Idempotency-Key`` (JSON; expires), by a digest of token, route and key."""
        return self._k(f"idem:{digest}")

    @property
    def audit(self) -> str:
        """Capped stream of changes to job definitions and states (the audit trail)."""
        return self._k("audit")

    @property
    def tombstones(self) -> str:
        """Hash: id of a job deleted by a versioned write (the Django outbox) -> the
        version of that delete. Until it expires, an upsert or a pause of an older
        version is refused, so a late write cannot bring the job back."""
        return self._k("tombstones")

    @property
    def tombstone_expiry(self) -> str:
        """Sorted set: id of a tombstone -> when it expires (ms, Redis' clock;
        ``zsched_tombstone_ttl_s`` after the delete)."""
        return self._k("tombstone_expiry")

    @property
    def outbox(self) -> str:
        """Hash, on the base prefix: the Django outbox as its sweeper last saw it
        (pending and dead-lettered changes, age of the oldest pending one, and when,
        on Redis' clock), for ``zsched exporter``."""
        return self._k("outbox")

    @property
    def directory(self) -> str:
        """Hash: job id -> index of the partition that holds it, for a job placed
        away from its id's own partition (a paced job lives in its domain's).

        It lives in the id's own partition (``partition_of(id, P)``), so an id
        alone finds its job in one lookup. It is written before the job and
        removed after it: an entry whose partition holds no such job reads as
        absent."""
        return self._k("dir")

    @property
    def moving(self) -> str:
        """Hash: job id -> its whole record (JSON) while an online move to another
        partition (a paced job whose domain changed) is under way; the move
        resumes from it after a crash."""
        return self._k("moving")

    @property
    def audit_cursor(self) -> str:
        """String: id of the last audit entry copied into the Django change history."""
        return self._k("audit_cursor")

    def all(self) -> list[str]:
        """Every key of the store (for tests and wiping a throwaway store)."""
        return [
            self.defs, self.schedule, self.http_schedule, self.queued, self.queue_in_flight,
            self.queue_held, self.received, self.leases, self.state,
            self.paused, self.dead, self.static, self.events, self.counters, self.drain_cursor,
            self.workers, self.domains, self.domain_conf, self.recrawl_mu, self.notify_limits,
            self.notify_digest, self.notify_held, self.audit, self.audit_cursor,
            self.tombstones, self.tombstone_expiry, self.outbox, self.directory, self.moving,
            self.robots, self.robots_claims, self.planner, self.planner_claim,
        ]
