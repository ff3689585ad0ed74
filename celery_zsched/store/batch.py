"""Many settles in one go: the job gateway's batch report (``POST /jobs/report``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_zsched.core.job import Job
from celery_zsched.core.results import SettleReport, SettleResult
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, time_ms, unavailable
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.hot import HotPath


class Batches(HotPath):
    """Settles in bulk: two round trips for any number of reports."""

    @unavailable
    def settle_many(self, reports: Sequence[SettleReport]) -> list[SettleResult]:
        """:meth:`settle` each of ``reports``, one answer each, in their order.

        Each is its own compare-and-set, exactly as if settled alone (a stale one
        changes nothing, whatever the others do). One pipeline reads every
        definition and each partition's clock, one more runs every settle script;
        a report whose job's timing was edited in between is settled again alone.
        """
        for report in reports:
            if report.outcome not in ("complete", "error", "skip"):
                raise ValueError(f"unknown outcome {report.outcome!r}")
        if not reports:
            return []
        keys = [self.part_of(report.job_id) for report in reports]
        cluster = is_cluster(self.client)
        pipe = self.client.pipeline(transaction=False)
        for report, part in zip(reports, keys, strict=True):
            pipe.hget(part.defs, report.job_id)
        # One clock per partition: on a Cluster, that of the node whose script settles.
        clocks = list(dict.fromkeys(part.defs for part in keys))
        for defs in clocks:
            options = {"target_nodes": self.client.get_node_from_key(defs)} if cluster else {}
            pipe.execute_command("TIME", **options)
        replies = pipe.execute()
        raws, times = replies[:len(reports)], replies[len(reports):]
        now_of = {defs: time_ms(reply) for defs, reply in zip(clocks, times, strict=True)}
        calls: list[Call] = []
        decided: list[tuple[Job | None, str]] = []
        for report, part, raw in zip(reports, keys, raws, strict=True):
            args, job, label = self.settle_args(report, raw, now_of[part.defs])
            calls.append((scripts.SETTLE, part, (), args))
            decided.append((job, label))
        out: list[SettleResult] = []
        for report, (job, label), reply in zip(reports, decided, self._run(calls),
                                               strict=True):
            result = self.settle_result(scripts.SETTLE.reply(reply), job, label)
            out.append(result if result is not None else self._settle_alone(report))
        return out

    def _settle_alone(self, report: SettleReport) -> SettleResult:
        options: dict[str, Any] = {
            "error": report.error, "retry_after_s": report.retry_after_s,
            "event": report.event, "http_status": report.http_status,
            "fence": report.fence, "delivery": report.delivery}
        return self.settle(report.job_id, report.occurrence, report.attempt, report.outcome,
                           **options)
