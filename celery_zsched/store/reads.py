"""Reading the store: definitions with their live state, listings, counts, domains."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from celery_zsched.core import stream_ids
from celery_zsched.core.domains import DomainInfo, domain_sort_key, info_from, normalise_domain
from celery_zsched.core.errors import JobNotFound
from celery_zsched.core.job import Job, definition_tag
from celery_zsched.core.results import (
    JobInfo,
)
from celery_zsched.core.state import RuntimeState
from celery_zsched.store.base import StoreBase, time_ms, unavailable
from celery_zsched.store.errors import redis_unavailable
from celery_zsched.store.keys import PARK_BASE, Keys, due_of


def as_paused(job: Job, paused: bool) -> Job:
    """``job`` with ``enabled`` taken from the paused set: the one record of that fact.

    The stored definition keeps the ``enabled`` it was last written with, while
    pause and resume only change the set, so readers always derive it.
    """
    return job if job.enabled is not paused else dataclasses.replace(job, enabled=not paused)


def first_score(*scores: float | None) -> int | None:
    """The first score that is set, as int ms (a job is in at most one of the sets)."""
    return next((int(x) for x in scores if x is not None), None)


class Reads(StoreBase):
    """Definitions and states, listings, counts, the domains' pacing, and the streams."""

    # ------------------------------------------------------------------ reads
    @unavailable
    def get(self, job_id: str) -> JobInfo:
        """One job with its state; raises :class:`JobNotFound`."""
        info = self.get_many([job_id])[0]
        if info is None:
            raise JobNotFound(job_id)
        return info

    @unavailable
    def get_many(self, ids: Sequence[str]) -> list[JobInfo | None]:
        """Many jobs in one round trip of seven commands, ``None`` for ids that do not exist."""
        if not ids:
            return []
        # ZMSCORE/SMISMEMBER (Redis >= 6.2) keep this at seven commands per
        # partition however many ids a page or a bulk action asks for, all in
        # one pipeline (on a Cluster, one round trip per node, in parallel).
        groups = self.group(ids)
        pipe = self.client.pipeline(transaction=False)
        for part, members in groups.items():
            keys = self.parts[part]
            pipe.hmget(keys.defs, members)
            pipe.hmget(keys.state, members)
            pipe.zmscore(keys.schedule, members)
            pipe.zmscore(keys.http_schedule, members)
            pipe.zmscore(keys.leases, members)
            pipe.zmscore(keys.queued, members)
            pipe.smismember(keys.paused, members)
        replies = pipe.execute()
        found: dict[str, JobInfo] = {}
        for n, members in enumerate(groups.values()):
            defs, states, beat_dues, http_dues, leases, queued, paused = replies[7 * n:7 * n + 7]
            dues = [b if b is not None else h for b, h in zip(beat_dues, http_dues, strict=True)]
            for i, raw in enumerate(defs):
                if raw is None:
                    continue
                state = RuntimeState.from_wire(states[i])
                found[members[i]] = JobInfo(
                    job=as_paused(Job.from_json(raw), bool(paused[i])),
                    status=state.status,
                    due_ms=due_of(dues[i]) if dues[i] is not None else None,
                    lease_until_ms=first_score(leases[i], queued[i]),
                    paused=bool(paused[i]), state=state, tag=definition_tag(raw))
        return [found.get(job_id) for job_id in ids]

    @unavailable
    def list_jobs(self, offset: int = 0, limit: int = 50) -> list[JobInfo]:
        """Scheduled jobs ordered by due time, one page.

        With partitions, each one's first ``offset + limit`` are merged: a deep
        page costs that many entries per partition.
        """
        end = offset + limit - 1

        def commands(pipe: Any, keys: Keys) -> None:
            pipe.zrange(keys.schedule, 0, end, withscores=True)
            pipe.zrange(keys.http_schedule, 0, end, withscores=True)

        replies = self._pipeline_each(commands)
        merged = heapq.merge(*(rows for part in replies for rows in part),
                             key=lambda row: (row[1], row[0]))
        ids = [str(job_id) for job_id, _ in list(merged)[offset:offset + limit]]
        return [info for info in self.get_many(ids) if info is not None]

    def iter_jobs(self, count: int = 1000) -> Iterator[Job]:
        """Every stored definition once (HSCAN: constant memory), for export and sync.

        ``enabled`` is read from the paused set, like everywhere else, so an
        export re-imports with the paused state it has now.
        Raises :class:`StoreUnavailable` if Redis goes away mid-scan.
        """
        # HSCAN may return an entry twice while the hash is rehashing; ids are
        # remembered so every job is yielded once (an id costs far less than a job).
        # A generator runs after the decorator returned, so it guards itself.
        with redis_unavailable():
            if not self.layout_checked:
                self.check_layout()
            for keys in self.parts:
                seen: set[str] = set()
                cursor = 0
                while True:
                    cursor, page = self.client.hscan(keys.defs, cursor, count=count)
                    assert isinstance(page, dict)  # HSCAN replies pairs; redis-py makes a dict
                    fresh = [(str(job_id), raw) for job_id, raw in page.items()
                             if job_id not in seen]
                    if fresh:
                        flags = self.client.smismember(keys.paused, [i for i, _ in fresh])
                        for (job_id, raw), paused in zip(fresh, flags, strict=True):
                            seen.add(job_id)
                            yield as_paused(Job.from_json(raw), bool(paused))
                    if not cursor:
                        break

    @unavailable
    def peek_next_due(self) -> int | None:
        """Due time of the earliest scheduled job (of any partition, either transport)."""
        def commands(pipe: Any, keys: Keys) -> None:
            pipe.zrange(keys.schedule, 0, 0, withscores=True)
            pipe.zrange(keys.http_schedule, 0, 0, withscores=True)

        replies = self._pipeline_each(commands)
        return min((due_of(first[0][1]) for part in replies for first in part if first),
                   default=None)

    @unavailable
    def due_counts(self, edges: Sequence[int], *, http: bool = False) -> list[int]:
        """Scheduled jobs due before ``edges[0]``, then in each ``[edges[i], edges[i+1])``.

        ``len(edges)`` ZCOUNTs per partition, all in one pipeline: the cost
        depends on the number of edges (and ``log N``), never on a scan.
        ``http``: count the HTTP schedules' jobs too (twice the ZCOUNTs).
        """
        if not edges:
            return []
        zsets = ("schedule", "http_schedule") if http else ("schedule",)

        def commands(pipe: Any, keys: Keys) -> None:
            for name in zsets:
                zset = getattr(keys, name)
                pipe.zcount(zset, "-inf", f"({edges[0]}")
                for low, high in itertools.pairwise(edges):
                    pipe.zcount(zset, low, f"({high}")

        totals = [0] * len(edges)
        for reply in self._pipeline_each(commands):
            for index, value in enumerate(reply):
                totals[index % len(edges)] += int(value)
        return totals

    @unavailable
    def stats(self) -> dict[str, int]:
        """Counts by state, jobs due soon, and lifetime counters."""
        now = self.now_ms()

        def commands(pipe: Any, keys: Keys) -> None:
            pipe.hlen(keys.defs)
            pipe.zcard(keys.schedule)
            pipe.zcard(keys.queued)
            pipe.zcard(keys.leases)
            pipe.scard(keys.paused)
            pipe.zcard(keys.dead)
            # HTTP jobs count like any job; http_scheduled says how many of them wait.
            for zset in (keys.schedule, keys.http_schedule):
                pipe.zcount(zset, "-inf", now)
                pipe.zcount(zset, "-inf", now + 60_000)
                pipe.zcount(zset, "-inf", now + 3_600_000)
            pipe.zcard(keys.http_schedule)
            pipe.zcount(keys.schedule, PARK_BASE, "+inf")
            pipe.hgetall(keys.counters)

        names = ("jobs", "scheduled", "queued", "running", "paused", "dead", "due_now",
                 "due_next_minute", "due_next_hour", "due_now", "due_next_minute",
                 "due_next_hour", "http_scheduled", "held_back")
        counts = dict.fromkeys(names, 0)
        totals: dict[str, int] = defaultdict(int)
        for reply in self._pipeline_each(commands):
            for name, value in zip(names, reply[:-1], strict=True):
                counts[name] = counts.get(name, 0) + int(value)
            counts["scheduled"] += int(reply[-3])
            for k, v in reply[-1].items():
                totals[f"total_{k}"] += int(v)
        out = {"jobs": counts["jobs"], "scheduled": counts["scheduled"],
               "in_flight": counts["queued"] + counts["running"], **counts, **totals}
        if len(self.parts) > 1:
            out["partitions"] = len(self.parts)
        if self.settings.pacing:
            alerts = self.domain_alerts()
            out["domains_throttled"] = len(alerts["throttled"])
            out["breakers_open"] = len(alerts["breakers_open"])
        return out

    @unavailable
    def queue_backpressure(self) -> dict[str, dict[str, int]]:
        """Per queue ("" for jobs that name none): occurrences published and not started
        (``in_flight``) and due jobs held back because the queue was at its bound
        (``held_back``), over every partition; only queues with either. Two HGETALLs
        per partition: the cost grows with the number of queues, not of jobs."""
        def commands(pipe: Any, keys: Keys) -> None:
            pipe.hgetall(keys.queue_in_flight)
            pipe.hgetall(keys.queue_held)

        out: dict[str, dict[str, int]] = {}
        for flights, held in self._pipeline_each(commands):
            for field_name, counts in (("in_flight", flights), ("held_back", held)):
                for queue, n in counts.items():
                    row = out.setdefault(str(queue), {"in_flight": 0, "held_back": 0})
                    row[field_name] += max(0, int(n))
        return dict(sorted(out.items()))

    # ---------------------------------------------------------------- domains
    @unavailable
    def domains(self) -> list[DomainInfo]:
        """Every domain with learned state or an override, sorted by name."""
        # By domain, each domain's state is in its own partition: gather them all.
        state: dict[Any, Any] = {}
        conf: dict[Any, Any] = {}
        for keys in self.parts if self.layout.by_domain else [self.keys]:
            state.update(self.client.hscan_iter(keys.domains))
            conf.update(self.client.hscan_iter(keys.domain_conf))
        now = self.now_ms()
        defaults = self.settings.pacing_defaults
        return [info_from(name, state.get(name), conf.get(name), defaults, now)
                for name in sorted(set(state) | set(conf), key=domain_sort_key)]

    @unavailable
    def domain(self, name: str) -> DomainInfo:
        """One domain's pacing (the defaults for a domain never seen)."""
        name = normalise_domain(name)
        keys = self.domain_keys(name)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys.domains, name)
        pipe.hget(keys.domain_conf, name)
        pipe.time()
        state, conf, now = pipe.execute()
        return info_from(name, state, conf, self.settings.pacing_defaults, time_ms(now))

    def domain_alerts(self) -> dict[str, list[str]]:
        """The domains slower than configured, and those whose breaker is not closed."""
        infos = self.domains()
        return {"throttled": [d.name for d in infos if d.throttled],
                "breakers_open": [d.name for d in infos if d.breaker != "closed"]}

    @unavailable
    def states(self, ids: Sequence[str]) -> list[RuntimeState | None]:
        """The runtime state of each of ``ids`` (one HMGET), ``None`` where there is none."""
        raws = self.per_job(ids, lambda pipe, keys, members: pipe.hmget(keys.state, members))
        return [RuntimeState.from_wire(raw) if raw else None for raw in raws]

    @unavailable
    def sample_states(self, per_partition: int) -> list[RuntimeState]:
        """Up to ``per_partition`` random runtime states of each partition (HRANDFIELD):
        fleet-wide estimates at a cost that does not grow with the fleet."""
        replies = self._pipeline_each(
            lambda pipe, keys: pipe.hrandfield(keys.state, per_partition, withvalues=True))
        return [RuntimeState.from_wire(raw) for reply in replies
                for raw in list(reply[0] or ())[1::2]]

    @unavailable
    def recent_events(self, since_ms: int, count: int) -> list[dict[str, str]]:
        """The fields of the newest ``count`` settle events since ``since_ms``, newest first."""
        replies = self._pipeline_each(
            lambda pipe, keys: pipe.xrevrange(keys.events, min=f"{since_ms}-0", count=count))
        rows = heapq.merge(*(part or [] for (part,) in replies),
                           key=lambda row: stream_ids.order(str(row[0])), reverse=True)
        return [{str(k): str(v) for k, v in (fields or {}).items()}
                for _sid, fields in list(rows)[:count]]

    @unavailable
    def dead_ids(self, limit: int) -> list[str]:
        """The ids of the ``limit`` most recently dead-lettered jobs."""
        replies = self._pipeline_each(
            lambda pipe, keys: pipe.zrevrange(keys.dead, 0, limit - 1, withscores=True))
        rows = heapq.merge(*(part for (part,) in replies), key=lambda row: row[1], reverse=True)
        return [str(job_id) for job_id, _ in list(rows)[:limit]]

    @unavailable
    def events(self, after: str = "0", count: int = 1000,
               part: int = 0) -> list[tuple[str, dict[str, str]]]:
        """Settle events of partition ``part`` after stream id ``after`` (for run history)."""
        rows = self.client.xrange(self.parts[part].events,
                                  min=f"({after}" if after != "0" else "-", count=count)
        return [(str(i), {str(k): str(v) for k, v in (fields or {}).items()})
                for i, fields in rows or []]

    @unavailable
    def static_ids(self) -> set[str]:
        """Ids of the jobs that came from ``beat_schedule``."""
        replies = self._pipeline_each(lambda pipe, keys: pipe.smembers(keys.static))
        return {str(m) for (members,) in replies for m in members}
