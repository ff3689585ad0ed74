"""A sweep of the outbox costs O(pending), never O(jobs): counted, not timed.

100,000 rows in the database and in Redis, 100 of them changed while Redis was
down. One sweep's SQL statements (Django's query log) and Redis commands
(``INFO commandstats`` of a redis-server this test starts, so nothing else
counts; commands run inside the Lua scripts included) are the same as with
1,000 rows, and grow linearly with the pending changes. Default settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from celery_zsched.contrib.django import conf, outbox
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.core.audit import Actor
from celery_zsched.core.job import Job
from tests.servers import RedisServer, running

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture
def counted_redis(tmp_path: Path, settings: Any) -> Iterator[redis.Redis]:
    """A redis-server of this test alone, the Django store on it; an admin client."""
    with running(RedisServer(tmp_path / "redis")) as (server,):
        settings.CELERY_ZSCHED_REDIS_URL = server.url()
        with server.admin() as admin:
            yield admin


def add_rows(start: int, stop: int) -> None:
    """Rows ``start``..``stop`` in the database and Redis, as a past import left them."""
    defaults = conf.get_defaults()
    jobs = [Job.from_dict({"url": f"https://example.invalid/{n}", "interval_s": 300},
                          defaults) for n in range(start, stop)]
    ZSchedJob.objects.bulk_create([ZSchedJob.from_job(job) for job in jobs], batch_size=2000)
    conf.get_store().upsert_many(jobs)


def change_while_redis_was_down(first: int, count: int) -> None:
    """``count`` single edits (one transaction and one version each) whose push never came."""
    rows = list(ZSchedJob.objects.order_by("pk")[first:first + count])
    for row in rows:
        with transaction.atomic():
            ZSchedJob.objects.filter(pk=row.pk).update(interval_s=600)
            outbox.record([row.job_id], outbox.SAVE, using="default", by=Actor("admin", "a"))


def measure(admin: redis.Redis) -> tuple[int, int, outbox.SweepReport]:
    """One sweep: its SQL statements and the Redis commands it caused."""
    admin.config_resetstat()
    with CaptureQueriesContext(connection) as queries:
        report = outbox.sweep()
    stats = admin.info("commandstats")
    commands = sum(int(v["calls"]) for k, v in stats.items()
                   if k not in ("cmdstat_config", "cmdstat_info"))
    return len(queries), commands, report


def test_a_sweep_costs_o_pending_sql_statements_and_redis_commands_not_o_jobs(
        counted_redis: redis.Redis) -> None:
    add_rows(0, 1_000)
    change_while_redis_was_down(0, 10)
    measure(counted_redis)  # warm-up: the store's layout check, script loading

    change_while_redis_was_down(100, 100)
    small_sql, small_redis, report = measure(counted_redis)
    assert (report.entries, report.pushed) == (100, 100)

    add_rows(1_000, 100_000)
    assert ZSchedJob.objects.count() == 100_000
    change_while_redis_was_down(50_000, 100)
    big_sql, big_redis, report = measure(counted_redis)
    assert (report.entries, report.pushed) == (100, 100)
    # The same cost at 100,000 rows as at 1,000: nothing scans the jobs.
    assert (big_sql, big_redis) == (small_sql, small_redis)

    change_while_redis_was_down(60_000, 200)
    double_sql, double_redis, report = measure(counted_redis)
    assert report.pushed == 200
    # Linear in the pending changes: statements stay 3 per sweep of up to 500
    # (entries, their rows, the confirming DELETE); commands per job are fixed.
    assert double_sql == big_sql == 3
    per_job = (double_redis - big_redis) / 100
    fixed = big_redis - 100 * per_job
    assert per_job == int(per_job) and per_job <= 30 and 0 <= fixed <= 5
    assert not ZSchedOutbox.objects.exists()
    print(f"\none sweep of 100 pending changes among 100,000 jobs: {big_sql} SQL statements, "
          f"{big_redis} Redis commands ({per_job:.0f} per job + {fixed:.0f}); "
          f"200 pending: {double_sql} statements, {double_redis} commands")
