"""zsched_import of 100,000 rows finishes in well under a minute (SQLite by default)."""

from __future__ import annotations

import time
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.core.management import call_command

from celery_zsched.contrib.django.models import ZSchedJob
from celery_zsched.store import Store

ROWS = 100_000


@pytest.mark.slow
@pytest.mark.django_db
def test_importing_100k_rows_takes_under_a_minute(tmp_path: Path, zstore: Store,
                                                  rclient: redis.Redis) -> None:
    path = tmp_path / "jobs.csv"
    with path.open("w", encoding="utf-8") as fp:
        fp.write("url,interval_s,cron,timezone,meta\n")
        for i in range(ROWS):
            if i % 10:
                interval = 300 * (1 + i % 3)
                fp.write(f'https://example.invalid/item/{i},{interval},,,"{{""n"":{i}}}"\n')
            else:
                fp.write(f"https://example.invalid/feed/{i},,*/15 * * * *,Europe/Berlin,\n")
    out = StringIO()
    started = time.perf_counter()
    call_command("zsched_import", "--file", str(path), stdout=out, stderr=StringIO())
    seconds = time.perf_counter() - started
    print(f"imported {ROWS} rows in {seconds:.1f}s: {out.getvalue().splitlines()[-1]}")
    assert seconds < 60
    assert ZSchedJob.objects.count() == ROWS
    assert rclient.hlen(zstore.keys.defs) == ROWS
    assert rclient.zcard(zstore.keys.schedule) == ROWS
