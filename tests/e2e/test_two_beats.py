"""Two beat processes over one storm of due jobs publish each occurrence exactly once."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from celery_zsched.store import task_id_for
from e2e.conftest import Deployment, log_events
from e2e.names import SCRAPE_TASK

pytestmark = pytest.mark.slow

JOBS = 2000


def broker_messages(d: Deployment) -> list[dict[str, Any]]:
    """Every message waiting in the deployment's broker database (kombu's JSON envelope)."""
    messages = []
    for key in d.broker.scan_iter(count=1000):
        if d.broker.type(key) == b"list":
            messages += [json.loads(raw) for raw in d.broker.lrange(key, 0, -1)]
    return messages


def promoted(text: str) -> int:
    """Jobs a beat published, summed over its ``poll_stats`` lines."""
    return sum(stats["promoted"] for stats in log_events(text, "poll_stats"))


def test_two_beats_publish_each_of_2000_due_occurrences_exactly_once(
        deploy: Callable[..., Deployment]) -> None:
    # Small batches, so the two beats interleave many claims instead of one each.
    # No worker runs, so the backpressure bound must admit the whole storm (one
    # queue: its bound is the whole cap).
    d = deploy(batch_size=50, max_queued=JOBS, queue_max_queued=JOBS)
    beats = [d.start_beat("beat1"), d.start_beat("beat2")]
    d.wait_for(lambda: all("static_synced" in b.text() for b in beats), 30,
               "both beats to start ticking")
    # Every job falls due at one instant, 2 s from now: longer than a beat's
    # longest idle sleep (max_interval = 1 s), so both beats are awake for the
    # storm instead of one draining it before the other's next tick.
    due_s = (d.store.now_ms() + 2000) / 1000
    jobs = [d.job(url=f"http://127.0.0.1:9/storm/{i}", interval_s=3600, start_at=due_s)
            for i in range(JOBS)]
    assert d.store.upsert_many(jobs, stagger=False).created == JOBS

    d.wait_for(lambda: sum(promoted(b.text()) for b in beats) >= JOBS, 30,
               f"the beats to publish {JOBS} jobs")
    stats = d.store.stats()
    assert (stats["scheduled"], stats["in_flight"], stats["total_promoted"]) == (0, JOBS, JOBS)

    messages = broker_messages(d)
    assert len(messages) == JOBS
    headers = [m["headers"] for m in messages]
    task_ids = Counter(h["id"] for h in headers)
    assert len(task_ids) == JOBS, task_ids.most_common(3)
    urls = {job.id: job.url for job in jobs}
    assert {h["zsched_job_id"] for h in headers} == set(urls)
    for message in messages:
        h = message["headers"]
        assert h["id"] == task_id_for(h["zsched_job_id"], h["zsched_occurrence"],
                                      h["zsched_attempt"])
        assert h["zsched_attempt"] == 1 and h["zsched_due_ms"] == int(due_s * 1000)
        args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        assert (h["task"], args, kwargs["url"]) == (SCRAPE_TASK, [], urls[h["zsched_job_id"]])
    per_beat = [promoted(b.text()) for b in beats]
    assert sum(per_beat) == JOBS and min(per_beat) > 0, per_beat
