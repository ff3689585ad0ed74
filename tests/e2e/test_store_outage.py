"""Beat outlives an outage of the Redis that holds the schedule, and recovers after it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from e2e.conftest import Deployment, RedisProcess, TargetServer, log_events

pytestmark = pytest.mark.slow

BACKOFF = "zsched: unavailable (attempt"


def test_beat_backs_off_while_the_store_is_down_and_publishes_again_after_restart(
        deploy: Callable[..., Deployment], spare_redis: RedisProcess,
        target: TargetServer) -> None:
    # The store is a redis-server of its own; the broker stays on the session server.
    d = deploy(store_url=spare_redis.url)
    path = "/ok/outage"
    job = d.job(url=target.url(path), interval_s=1)
    d.store.upsert(job)
    beat = d.start_beat()
    d.start_worker()
    d.wait_for(lambda: len(target.hits(path)) >= 2, 30, "2 runs before the outage")

    spare_redis.kill()
    down = time.monotonic()
    d.wait_for(lambda: beat.text().count(BACKOFF) >= 3, 30, "beat to back off 3 times")
    assert time.monotonic() - down >= 2.5, "backoff delays of 1 s and 2 s"
    assert beat.alive()
    ticks_before_restart = len(log_events(beat.text(), "poll_stats"))

    spare_redis.start()  # same port, empty: it kept nothing on disk
    assert d.store.get_many([job.id]) == [None]
    d.store.upsert(job)  # re-import, as `zsched_sync` would after a data loss
    restarted = time.monotonic()

    d.wait_for(lambda: len([t for t in target.times(path) if t > restarted]) >= 2, 60,
               "2 runs after the store came back")
    assert beat.alive()
    assert len(log_events(beat.text(), "poll_stats")) > ticks_before_restart
    info = d.wait_info(job.id, lambda i: i.state.runs >= 1, 10,
                       "a settled run after the restart")
    assert info.state.last_outcome == "complete", info.state
