"""A beat killed between claim and publish costs the publish deadline, not hours (issue 18).

Two real beats share one store; one of them is killed again and again at the
worst moment: it SIGKILLs itself right after a claim, before publishing the
batch (``E2E_BEAT_DIE_AFTER_S``), so every kill leaves claimed occurrences that
have no message anywhere. Every setting is its default: the publish deadline
(30 s), the delivery deadline (2 h), the lease. A prefork worker runs what is
published; the target records each execution by its task id.

Proven: every occurrence a killed beat claimed is published again, with the
same task id, within the publish deadline plus one tick (on Redis' clock: the
promotion the settle reports against the claim's); each occurrence runs
exactly once (0 duplicates); every job keeps running (0 lost).
"""

from __future__ import annotations

import json
import random
import signal
from collections import Counter
from collections.abc import Callable

import pytest

from celery_zsched.store import task_id_for
from e2e.conftest import Deployment, TargetServer
from e2e.names import ENV_BEAT_DIE_AFTER_S
from e2e.observe import SOAK, report, settles, states, wait_all, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600 if SOAK else 600)]

JOBS = 2000 if SOAK else 300
KILLS = 50 if SOAK else 3
#: "400 jobs every 5-10 s" of the report: each job's interval is drawn from this.
INTERVALS_S = (5.0, 10.0)
#: How long each incarnation of the killed beat lives before it dies mid-claim.
LIFETIMES_S = (1.0, 4.0)
#: One tick: beat sleeps at most max_interval (1 s) between reaps. The rest of the
#: slack is the reaping beat's own tick on a loaded 2-core machine.
TICK_MS = 1000
SLACK_MS = 2000

#: (job id, occurrence, attempt) -> (its publishes, its promotion on Redis' clock).
Claims = dict[tuple[str, int, int], tuple[int, int]]


def _unconfirmed(d: Deployment, before_ms: int) -> Claims:
    """Claims made before ``before_ms`` whose publish no beat confirmed (yet)."""
    return {(job_id, st.occurrence, st.attempt): (st.publishes, st.promoted_ms or 0)
            for job_id, st in states(d).items()
            if st.status == "queued" and st.queue is None
            and st.promoted_ms is not None and st.promoted_ms < before_ms}


def test_a_beat_killed_between_claim_and_publish_costs_the_publish_deadline_not_hours(
        deploy: Callable[..., Deployment], target: TargetServer,
        request: pytest.FixtureRequest) -> None:
    d = deploy()  # every timeout at its default
    publish_ms = int(d.settings.publish_timeout_s * 1000)
    rng = random.Random(18)
    jobs = [d.job(url=target.url(f"/ok/beat/{i}"), interval_s=rng.uniform(*INTERVALS_S))
            for i in range(JOBS)]
    assert d.store.upsert_many(jobs).created == JOBS
    ids = [job.id for job in jobs]
    wait_ready(d, d.start_worker("w", pool="prefork", concurrency=4))
    d.start_beat("steady")

    candidates: Claims = {}
    for k in range(KILLS):
        victim = d.start_beat(f"victim{k}", env={
            ENV_BEAT_DIE_AFTER_S: f"{rng.uniform(*LIFETIMES_S):.2f}"})
        victim.expect_alive = False  # it dies on purpose
        d.wait_for(lambda v=victim: v.popen.poll() is not None, 60, f"{victim.name} to die")
        assert victim.popen.returncode == -signal.SIGKILL, victim.text()[-2000:]
        # Its claims have no message; the steady beat's own claims made before now are
        # confirmed a moment later, which the settles below tell apart.
        candidates.update(_unconfirmed(d, d.store.now_ms()))

    end_ms = d.store.now_ms()
    wait_all(d, ids, lambda st: (st.last_settled_ms or 0) > end_ms + publish_ms,
             publish_ms / 1000 + max(INTERVALS_S) + 90,
             "every job to settle a run after the last orphan's publish deadline")

    events = settles(d)
    promoted = {(e["id"], int(e["occ"]), int(e["attempt"])): json.loads(e["data"])["promoted_ms"]
                for e in events}
    # An orphan's settle reports the promotion of its second publish; a claim of the
    # steady beat that was only confirmed late reports its own.
    recovery = {key: promoted[key] - claimed_ms for key, (_x, claimed_ms) in candidates.items()
                if key in promoted and promoted[key] != claimed_ms}
    unsettled = [key for key in candidates if key not in promoted]
    runs = Counter(hit.task_id for hit in target.hits_under("/ok/beat/"))
    duplicates = {task_id: n for task_id, n in runs.items() if n > 1}
    orphans = sorted(recovery.values())
    st = states(d)
    report(request, "beat_crash_loop", jobs=JOBS, kills=KILLS, orphaned=len(orphans),
           recovery_ms_p50=orphans[len(orphans) // 2] if orphans else None,
           recovery_ms_max=orphans[-1] if orphans else None, publish_timeout_ms=publish_ms,
           duplicates=len(duplicates), lost=len(unsettled),
           unpublished_counter=int(d.store.client.hget(d.store.keys.counters, "unpublished")
                                   or 0),
           executions=sum(runs.values()))

    assert len(orphans) >= KILLS, "every kill must leave claims without a message"
    assert orphans[-1] <= publish_ms + TICK_MS + SLACK_MS, orphans[-5:]
    assert orphans[0] >= publish_ms, "republished before the publish deadline"
    assert not unsettled, unsettled[:5]
    assert not duplicates, duplicates
    # Each orphan ran once, under the task id of its first publish.
    assert all(runs[task_id_for(*key)] == 1 for key in recovery)
    assert all(st[job_id].status != "dead" for job_id in ids)
