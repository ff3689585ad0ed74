"""``iter_due`` walks the schedule in due order across partitions, lazily, and
``due_times`` tells scheduled ids from the rest (what the admin's next-run sort reads)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celery_zsched.config import Settings
from celery_zsched.core.errors import StoreUnavailable
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from celery_zsched.store.due_order import due_times, iter_due


def _jobs(count: int) -> list[Job]:
    return [Job.from_dict({"id": f"j{n:03d}", "task": "t", "interval_s": 60 + n, "jitter_s": 0})
            for n in range(count)]


@pytest.mark.parametrize("partitions", [1, 4])
def test_iter_due_merges_every_partition_in_due_order(make_store: Callable[..., Store],
                                                      partitions: int) -> None:
    store = make_store(partitions=partitions)
    store.upsert_many(_jobs(60))  # staggered: first runs spread, some at equal times
    store.pause("j007", "j042")
    scores = {str(i): s for keys in store.parts
              for i, s in store.client.zrange(keys.schedule, 0, -1, withscores=True)}
    expected = sorted(scores, key=lambda i: (scores[i], i))
    assert len(expected) == 58 and "j007" not in expected
    assert list(iter_due(store, chunk=7)) == expected
    assert list(iter_due(store, descending=True, chunk=7)) == expected[::-1]


def test_iter_due_reads_only_what_the_caller_takes(make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=2)
    store.upsert_many(_jobs(40))
    before = store.client.info("commandstats").get("cmdstat_zrange", {}).get("calls", 0)
    walk = iter_due(store, chunk=5)
    first = [next(walk) for _ in range(3)]
    after = store.client.info("commandstats")["cmdstat_zrange"]["calls"]
    assert len(first) == 3 and after - before == 2  # one chunk per partition, not 40 ids


def test_due_times_marks_ids_without_a_due_time(make_store: Callable[..., Store]) -> None:
    store = make_store(partitions=3)
    store.upsert_many(_jobs(5))
    store.pause("j001")
    dues = due_times(store, ["j000", "j001", "nope", "j004"])
    assert dues[1] is None and dues[2] is None
    assert dues[0] == store.get("j000").due_ms and dues[3] == store.get("j004").due_ms
    assert due_times(store, []) == []


def test_an_unreachable_redis_is_store_unavailable(make_settings: Callable[..., Settings]
                                                   ) -> None:
    down = Store.from_settings(make_settings(redis_url="redis://127.0.0.1:1/0"))
    with pytest.raises(StoreUnavailable):
        list(iter_due(down))
    with pytest.raises(StoreUnavailable):
        due_times(down, ["a"])
