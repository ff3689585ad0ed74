"""Changing jobs: upserts, the controls, and domain overrides; each change audited."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from celery_zsched.core.audit import Actor, audit_args
from celery_zsched.core.domains import DomainInfo, normalise_domain
from celery_zsched.core.errors import JobNotFound
from celery_zsched.core.job import Job
from celery_zsched.core.results import (
    ImportReport,
    JobInfo,
)
from celery_zsched.core.timing import jitter_ms
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, ScriptStream, first, unavailable
from celery_zsched.store.moves import MoveDeferred, Moves
from celery_zsched.store.scripts import ControlReply


def version_arg(versions: Mapping[str, int | None] | None, job_id: str) -> str:
    """A script row's version field: "" for none (an unversioned write)."""
    version = versions.get(job_id) if versions else None
    return str(int(version)) if version else ""


class Writes(Moves):
    """Storing definitions (staggered, idempotent) and the controls: pause, resume,
    run now, delete, reset, requeue, purge; domain overrides."""

    # ----------------------------------------------------------------- writes
    def upsert(self, job: Job, *, static: bool = False, by: Actor | None = None,
               note: str = "", expect: str = "", version: int | None = None) -> ImportReport:
        """Store one job. A new job first runs now (cron: its next slot).

        The change is recorded in the audit trail as made ``by`` (default: ``api``).
        ``expect`` makes the write conditional, checked atomically with it:
        ``"absent"`` (no job of this id yet: a create) or the :func:`definition_tag`
        of the definition it replaces (compare-and-set). When it does not hold,
        nothing is written and the report counts the job as ``skipped``.
        ``version``: see ``versions`` of :meth:`upsert_many`.
        """
        report = self.upsert_many([job], stagger=False, static=static, by=by, note=note,
                                  expect={job.id: expect} if expect else None,
                                  versions={job.id: version} if version else None)
        if report.deferred:
            raise MoveDeferred(job.id)
        return report

    @unavailable
    def upsert_many(self, jobs: Iterable[Job], *, stagger: bool = True, static: bool = False,
                    total: int | None = None,
                    progress: Callable[[int], None] | None = None,
                    first_due: dict[str, int | None] | None = None,
                    by: Actor | None = None, note: str = "",
                    expect: Mapping[str, str] | None = None,
                    versions: Mapping[str, int] | None = None) -> ImportReport:
        """Store many jobs, pipelined in chunks; new jobs' first runs are staggered.

        Job ``i`` of ``total`` first runs at ``now + i/total * interval + jitter``,
        so an import spreads evenly over each job's interval. Jobs that already
        exist keep their schedule (ZADD NX) unless their timing changed.
        ``first_due`` (id -> epoch ms, ``None`` = never runs) overrides the first
        run of the jobs it names, e.g. to continue another scheduler's timeline.
        Each created or changed job is recorded in the audit trail as changed
        ``by`` (default: ``api``), with ``note``; an unchanged one records nothing.
        ``expect`` (id -> condition) makes the writes of the jobs it names
        conditional, as for :meth:`upsert`. ``versions`` (id -> a version that
        only grows, from the Django row) makes them versioned: a job whose stored
        version, or whose delete's tombstone, is newer is left alone and counted
        as ``stale``, so pushes that arrive out of order never move a definition
        back. Jobs without one are written whatever their stored version.
        """
        if total is None:
            jobs = list(jobs)
            total = len(jobs)
        started = time.perf_counter()
        now = self.now_ms()
        report = ImportReport(total=total)
        chunks: dict[int, list[tuple[str, ...]]] = defaultdict(list)
        flag = {"static": "1" if static else "0",
                **audit_args(self.settings.audit_maxlen, by, note)}
        done = 0
        upsert = scripts.UPSERT
        self.resume_moves()
        with contextlib.ExitStack() as stack:
            streams: dict[int, ScriptStream] = {}

            def send(part: int, rows: list[tuple[str, ...]]) -> list[tuple[int, Any]]:
                if part not in streams:
                    streams[part] = stack.enter_context(ScriptStream(
                        self.client, self._scripts[upsert.name],
                        upsert.key_names(self.parts[part])))
                return streams[part].call(upsert.argv(flag, rows), len(rows))

            index = 0
            for batch in self._placed_batches(jobs):
                homes = {job.id: self.layout.home(job.id, dm) for job, dm in batch}
                busy = self.place(homes)
                report.deferred += len(busy)
                report.deferred_ids += sorted(busy)
                for job, dm in batch:
                    index += 1
                    if job.id in busy:
                        continue
                    phase = (index - 1) / total if stagger and total else 0.0
                    gap = ""
                    if first_due is not None and job.id in first_due:
                        due = first_due[job.id]
                    else:
                        due = job.first_due_ms(now, self.settings, self.rng, phase)
                        gap = self._gap_after_last_run(job)
                    part = homes[job.id]
                    chunk = chunks[part]
                    chunk.append((job.id, job.to_json(), "" if due is None else str(due),
                                  "1" if job.enabled else "0", job.timing_signature, gap,
                                  dm or "", "h" if job.transport == "http" else "",
                                  expect.get(job.id, "") if expect else "",
                                  version_arg(versions, job.id)))
                    if len(chunk) >= self.settings.import_chunk:
                        # Redis runs this chunk while the loop builds the next one.
                        for rows, result in send(part, chunk):
                            done = self._tally(upsert.reply(result), report, done + rows,
                                               progress)
                        chunks[part] = []
            replies = [reply for part, chunk in chunks.items() if chunk
                       for reply in send(part, chunk)]
            replies += [reply for stream in streams.values() for reply in stream.drain()]
            for rows, result in replies:
                done = self._tally(upsert.reply(result), report, done + rows, None)
        if progress:
            progress(done)
        report.seconds = time.perf_counter() - started
        return report

    def _placed_batches(self, jobs: Iterable[Job]) -> Iterator[list[tuple[Job, str | None]]]:
        """``jobs`` with the domain each is paced under, in batches of ``import_chunk``."""
        batch: list[tuple[Job, str | None]] = []
        size = self.settings.import_chunk
        for job in jobs:
            batch.append((job, job.pacing_domain(self.settings)))
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _gap_after_last_run(self, job: Job) -> str:
        """How long after its last run an interval job may run again (interval + jitter).

        A rescheduling edit or a resume never makes a job due earlier than this
        after its last run: a target is never hit more often than its interval.
        """
        if job.kind != "interval" or job.interval_s is None:
            return ""
        jitter = jitter_ms(job.effective_jitter_s(self.settings), self.rng)
        return str(round(job.interval_s * 1000) + jitter)

    @staticmethod
    def _tally(result: Sequence[int], report: ImportReport, done: int,
               progress: Callable[[int], None] | None) -> int:
        """Add one chunk's counts to ``report``; ``done`` rows are stored so far."""
        created, updated, rescheduled, skipped, stale = result
        report.skipped += skipped
        report.stale += stale
        report.created += created
        report.updated += updated
        report.rescheduled += rescheduled
        if progress:
            progress(done)
        return done

    def _control(self, op: str, ids: Sequence[str], by: Actor | None, note: str,
                 dues: Sequence[int | str] | None = None,
                 versions: Mapping[str, int] | None = None) -> int:
        reply = self._control_all(op, ids, by, note, dues, versions)
        if reply.missing and len(ids) == 1:
            raise JobNotFound(reply.missing[0])
        return reply.changed

    def _control_all(self, op: str, ids: Sequence[str], by: Actor | None, note: str,
                     dues: Sequence[int | str] | None = None,
                     versions: Mapping[str, int] | None = None) -> ControlReply:
        by_part = self.group([(job_id, dues[i] if dues else 0, version_arg(versions, job_id))
                              for i, job_id in enumerate(ids)], first)
        size = self.settings.import_chunk
        args = {"operation": op, **audit_args(self.settings.audit_maxlen, by, note),
                "tombstone_ms": round(self.settings.tombstone_ttl_s * 1000)}
        calls: list[Call] = [
            (scripts.CONTROL, self.parts[part], rows[start:start + size], args)
            for part, rows in by_part.items() for start in range(0, len(rows), size)]
        changed, stale = 0, 0
        missing: list[str] = []
        for result in self._run(calls) if calls else []:
            reply = scripts.CONTROL.reply(result)
            changed += reply.changed
            stale += reply.stale
            missing += reply.missing
        if op == "delete":
            # The job first, then its directory entry.
            self.unpoint_deleted(ids)
        return ControlReply(changed, stale, tuple(missing))

    @unavailable
    def control(self, op: str, ids: Sequence[str], *, versions: Mapping[str, int],
                by: Actor | None = None, note: str = "") -> ControlReply:
        """Versioned ``pause``, ``resume`` or ``delete`` of ``ids`` (the Django outbox).

        Each job's change applies only if Redis holds no newer version of it
        (``versions``: id -> version, from the row); a delete leaves a tombstone
        of its version for ``zsched_tombstone_ttl_s``, even for an id Redis never
        had, so an older upsert that arrives later cannot bring the job back.
        Never raises :class:`JobNotFound`: the reply names the ids not found.
        """
        if op not in ("pause", "resume", "delete"):
            raise ValueError(f"not a versioned operation: {op!r}")
        dues = self._resume_dues(ids) if op == "resume" else None
        return self._control_all(op, ids, by, note, dues, versions)

    @unavailable
    def delete(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Delete jobs; an in-flight occurrence's settle will not bring them back."""
        return self._control("delete", ids, by, note)

    @unavailable
    def pause(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Pause jobs; an in-flight occurrence still settles but is not rescheduled."""
        return self._control("pause", ids, by, note)

    @unavailable
    def resume(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Resume paused (or dead-lettered) jobs; they never run earlier than they would have.

        An interval job runs at its last run + interval (or now, if that has
        passed), plus jitter; a cron job at its next slot after now; a job that
        never ran follows the first-run rule.
        """
        return self._control("resume", ids, by, note, self._resume_dues(ids))

    def _resume_dues(self, ids: Sequence[str]) -> list[int | str]:
        now = self.now_ms()
        dues: list[int | str] = []
        for info in self.get_many(ids):
            due = self._resume_due(info, now) if info else now
            # "" tells the script the job is over (its end_at has passed): it is
            # unpaused but finished, never run once more.
            dues.append("" if due is None else due)
        return dues

    def _resume_due(self, info: JobInfo, now: int) -> int | None:
        job, last = info.job, info.state.last_settled_ms
        start = now
        if job.kind == "interval" and job.interval_s is not None and last is not None:
            start = max(now, last + round(job.interval_s * 1000))
        return job.first_due_ms(start, self.settings, self.rng)

    @unavailable
    def run_now(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Make jobs due now (jobs in flight are left alone)."""
        return self._control("run_now", ids, by, note)

    @unavailable
    def reset_failures(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Zero failure counters; a dead-lettered job is brought back as due now."""
        return self._control("reset", ids, by, note)

    @unavailable
    def requeue_dead(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Dead letters: unpaused and due now, counters reset (see :mod:`.dead`).

        Ids that are not dead letters (any more) are left alone and not counted.
        """
        return self._control("requeue", ids, by, note)

    @unavailable
    def purge_dead(self, *ids: str, by: Actor | None = None, note: str = "") -> int:
        """Dead letters: dropped from the dead set; the jobs are kept, paused."""
        return self._control("purge", ids, by, note)

    @unavailable
    def set_domain(self, name: str, *, delay_s: float | None = None,
                   max_in_flight: int | None = None,
                   adaptive: bool | None = None) -> DomainInfo:
        """Override a domain's delay, cap or adaptivity (``None`` leaves one as it is)."""
        name = normalise_domain(name)
        changes: dict[str, Any] = {}
        if delay_s is not None:
            if not math.isfinite(delay_s) or delay_s < 0:
                raise ValueError(f"delay must be a number of seconds >= 0, got {delay_s!r}")
            changes["delay"] = round(delay_s * 1000)
        if max_in_flight is not None:
            if max_in_flight < 0:
                raise ValueError(f"max_in_flight must be >= 0 (0: no cap), got {max_in_flight!r}")
            changes["cap"] = int(max_in_flight)
        if adaptive is not None:
            changes["adaptive"] = bool(adaptive)
        if changes:
            self._call(scripts.DOMAIN, self.domain_keys(name), operation="set", domain=name,
                       changes=json.dumps(changes))
        return self.domain(name)

    @unavailable
    def reset_domain(self, name: str) -> bool:
        """Back to the defaults: drop the overrides and what was learned (in-flight
        accounting stays). ``False`` when the domain was not known."""
        name = normalise_domain(name)
        return bool(self._call(scripts.DOMAIN, self.domain_keys(name), operation="reset",
                               domain=name, changes=""))

    def refresh_domains(self, progress: Callable[[int], None] | None = None) -> int:
        """Store every job again so its state names the domain it is paced under.

        A job learns its domain when it is stored; run this after turning
        ``zsched_pacing`` on (or changing ``zsched_domain_registrable``) for
        jobs stored before. Schedules do not move (re-storing is idempotent).
        """
        report = self.upsert_many(self.iter_jobs(), stagger=False, total=0, progress=progress)
        return report.created + report.updated
