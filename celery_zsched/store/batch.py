"""Many settles in one go: the job gateway's batch report (``POST /jobs/report``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from celery_zsched.core.job import Job
from celery_zsched.core.results import SettleReport, SettleResult
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, pooled_connection, time_ms, unavailable
from celery_zsched.store.connection import is_cluster
from celery_zsched.store.hot import HotPath
from celery_zsched.store.keys import Keys
from celery_zsched.store.lane import PACKS, packed_evalsha
from celery_zsched.store.settles import LABELS


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
            if report.outcome not in LABELS:
                raise ValueError(f"unknown outcome {report.outcome!r}")
        if not reports:
            return []
        keys = [self.part_of(report.job_id) for report in reports]
        raws, now_of = self._definitions_and_clocks(reports, keys)
        calls: list[Call] = []
        decided: list[tuple[Job | None, str]] = []
        for report, part, raw in zip(reports, keys, raws, strict=True):
            job, label, args = self._settle_args(
                report.job_id, report.occurrence, report.attempt, report.outcome, raw,
                now_of[part.defs], error=report.error, retry_after_s=report.retry_after_s,
                event=report.event, http_status=report.http_status, fence=report.fence,
                delivery=report.delivery, visit=report.visit)
            calls.append((scripts.SETTLE, part, (), args))
            decided.append((job, label))
        out: list[SettleResult] = []
        for report, (job, label), reply in zip(reports, decided, self._run_packed(calls),
                                               strict=True):
            result = self._settle_result(job, label, scripts.SETTLE.reply(reply))
            out.append(result if result is not None else self._settle_alone(report))
        return out

    def _definitions_and_clocks(self, reports: Sequence[SettleReport], keys: Sequence[Keys]
                                ) -> tuple[list[str | None], dict[str, int]]:
        """Each report's job definition, and the clock of each partition (by its defs
        key): on a Cluster, that of the node whose script settles (one round trip)."""
        cluster = is_cluster(self.client)
        ids: dict[str, list[str]] = {}
        for report, part in zip(reports, keys, strict=True):
            ids.setdefault(part.defs, []).append(report.job_id)
        pipe = self.client.pipeline(transaction=False)
        for defs, members in ids.items():
            options = {"target_nodes": self.client.get_node_from_key(defs)} if cluster else {}
            pipe.hmget(defs, members)
            pipe.execute_command("TIME", **options)
        replies = pipe.execute()
        found = {(defs, job_id): raw
                 for (defs, members), raws in zip(ids.items(), replies[0::2], strict=True)
                 for job_id, raw in zip(members, raws, strict=True)}
        now_of = {defs: time_ms(reply) for defs, reply in zip(ids, replies[1::2], strict=True)}
        return [found[part.defs, r.job_id] for r, part in zip(reports, keys, strict=True)], now_of

    def _run_packed(self, calls: Sequence[Call]) -> list[Any]:
        """:meth:`_run`, but packed by hiredis and written at once on one pooled connection:
        redis-py's pipeline packs each command in Python, which costs a batch of
        settles (35 arguments each) more client CPU than all the rest of it. A Cluster
        client, or a connection without hiredis, takes :meth:`_run`."""
        pool = getattr(self.client, "connection_pool", None)
        if pool is None or is_cluster(self.client) or not PACKS or len(calls) < 2:
            return self._run(calls)
        commands = [packed_evalsha(self._scripts[spec.name].sha, spec.key_names(keys),
                                   spec.argv(args, rows))
                    for spec, keys, rows, args in calls]
        conn = pooled_connection(pool)
        replies: list[Any] = []
        try:
            conn.send_packed_command([b"".join(commands)])
            for _ in commands:
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # read whole: the next reply follows
                    replies.append(exc)
        except BaseException:
            conn.disconnect()  # a reply may be left unread: never reuse it
            raise
        finally:
            pool.release(conn)
        return self._script_replies(calls, replies)

    def _settle_alone(self, report: SettleReport) -> SettleResult:
        options: dict[str, Any] = {
            "error": report.error, "retry_after_s": report.retry_after_s,
            "event": report.event, "http_status": report.http_status,
            "fence": report.fence, "delivery": report.delivery, "visit": report.visit}
        return self.settle(report.job_id, report.occurrence, report.attempt, report.outcome,
                           **options)
