"""Conditional fetches and change-aware recrawl through a real beat and a prefork worker
(issue 22): the validators reach the task in its message, a 304 settles as a visit
without change and a success, and an adaptive job's interval follows its visits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.conftest import ETAG, Deployment, TargetServer

pytestmark = pytest.mark.slow


def test_a_304_path_through_beat_and_a_prefork_worker(
        deploy: Callable[..., Deployment], target: TargetServer) -> None:
    d = deploy()
    # Adaptive, between 1 s and 2 s: each unchanged visit pushes toward 2 s.
    job = d.job(url=target.url("/etag/a"), interval_s=1, recrawl="adaptive",
                min_interval_s=1, max_interval_s=2, jitter_s=0)
    d.store.upsert(job)
    d.start_beat()
    d.start_worker(pool="prefork", concurrency=2)

    d.wait_for(lambda: len(target.hits("/etag/a")) >= 4, 60, "4 hits on /etag/a")
    hits = target.hits("/etag/a")
    # The first fetch had nothing to send; every later one sent the stored ETag.
    assert hits[0].if_none_match is None
    assert [h.if_none_match for h in hits[1:4]] == [ETAG] * 3
    info = d.wait_info(job.id, lambda i: (i.state.visits or 0) >= 2, 20,
                       "2 visits recorded (the first 200 is the baseline)")
    state = info.state
    assert state.etag == ETAG
    # 304s: visits without change, and successes (no failure, nothing retried).
    assert state.changes == 0 and state.failures == 0 and state.consecutive_failures == 0
    assert state.last_outcome == "complete"
    assert state.recrawl_interval_ms == 2000
    events = d.store.events()
    assert {fields["status"] for _id, fields in events} == {"complete"}
