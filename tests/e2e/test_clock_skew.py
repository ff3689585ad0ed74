"""expires_s is measured on Redis' clock: skewed beat and worker hosts still run their jobs.

Beat and the worker run under libfaketime (Debian package ``faketime``) with
their clocks an hour apart, in both directions. Celery's own ``expires`` would
be an absolute time on beat's clock compared with the worker's, so every run
would be discarded as expired; celery-zsched checks the wait at start, as
Redis time minus the promotion time, which no host clock touches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from e2e.conftest import Deployment, TargetServer, log_events

pytestmark = pytest.mark.slow

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
RUNS = 4


def _logged_hour(text: str) -> str:
    """The hour of the first ``[YYYY-MM-DD HH:MM:SS,mmm: ...]`` log line."""
    match = re.search(r"^\[\d{4}-\d\d-\d\d (\d\d):", text, re.M)
    assert match, text[:500]
    return match.group(1)


def skewed(offset: str) -> dict[str, str]:
    """Environment that moves a process's wall clock by ``offset`` (``+1h``, ``-1h``)."""
    # The monotonic clock is shifted too (by a constant, so durations hold):
    # with DONT_FAKE_MONOTONIC, libfaketime's clock_nanosleep fails with EINVAL.
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": offset}


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime (Debian faketime) missing")
@pytest.mark.parametrize(("beat_clock", "worker_clock"), [("-1h", "+1h"), ("+1h", "-1h")])
def test_a_job_with_expires_runs_when_beat_and_worker_clocks_are_an_hour_apart(
        deploy: Callable[..., Deployment], target: TargetServer,
        beat_clock: str, worker_clock: str) -> None:
    d = deploy()
    path = "/ok/skew"
    job = d.job(url=target.url(path), interval_s=1, expires_s=20)
    d.store.upsert(job)
    worker = d.start_worker(env=skewed(worker_clock))
    beat = d.start_beat(env=skewed(beat_clock))

    d.wait_info(job.id, lambda i: i.state.runs >= RUNS, 60,
                f"{RUNS} runs of a job with expires_s under skewed clocks")

    assert len(target.hits(path)) >= RUNS
    settled = [f for _id, f in d.store.events() if f["id"] == job.id]
    assert settled and all(f["status"] == "complete" for f in settled), settled
    assert log_events(worker.text(), "job_expired") == []
    # The processes really ran an hour apart (this is what made Celery's own
    # expires discard every run before): their log lines carry their clocks.
    assert _logged_hour(beat.text()) != _logged_hour(worker.text())
    sent = [e for e in log_events(worker.text(), "job_complete") if e["job_id"] == job.id]
    assert sent and all(e["wait_ms"] is not None and 0 <= e["wait_ms"] < 20_000 for e in sent)
