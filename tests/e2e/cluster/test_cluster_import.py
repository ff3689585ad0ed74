"""A bulk import of 100,000 jobs into a partitioned store on a Redis Cluster, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from celery_zsched.store import Store
from celery_zsched.store.keys import partition_of
from e2e.cluster.conftest import CLUSTER_PARTITIONS
from e2e.conftest import REPO_ROOT
from tests.cluster import LocalCluster

pytestmark = pytest.mark.slow

JOBS = 100_000
CELERY = str(Path(sys.executable).parent / "celery")


def test_a_cli_import_of_100000_jobs_spreads_them_over_every_partition_and_master(
        cluster: LocalCluster, cluster_store: Callable[..., Store], tmp_path: Path) -> None:
    store = cluster_store()
    rows = [{"url": f"https://example.com/page/{i}", "interval_s": 300} for i in range(JOBS)]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(rows))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZSCHED_", "CELERY_"))}
    env.update({"PYTHONPATH": str(REPO_ROOT), "ZSCHED_REDIS_URL": cluster.url,
                "ZSCHED_REDIS_CLUSTER": "1", "ZSCHED_PARTITIONS": str(CLUSTER_PARTITIONS),
                "ZSCHED_KEY_PREFIX": store.base.prefix})
    started = time.perf_counter()
    done = subprocess.run([CELERY, "-A", "tests.cli_app", "zsched", "import", "-f", str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nCLI import of {JOBS} jobs into {CLUSTER_PARTITIONS} partitions on 3 masters: "
          f"{seconds:.1f} s (process included); {done.stdout.strip().splitlines()[-1]}")

    # Counted on the nodes themselves: each partition's hash on the master of its slot.
    ids = [j.id for j in store.iter_jobs()]
    assert len(ids) == len(set(ids)) == JOBS
    expected = Counter(partition_of(job_id, CLUSTER_PARTITIONS) for job_id in ids)
    per_master: Counter[int] = Counter()
    for index, keys in enumerate(store.parts):
        master = cluster.master_of_key(keys.defs)
        with cluster.node(master).admin() as node:
            held, scheduled = node.hlen(keys.defs), node.zcard(keys.schedule)
        assert held == scheduled == expected[index], (index, held, scheduled)
        per_master[master] += held
    print(f"jobs per partition: {[expected[i] for i in range(CLUSTER_PARTITIONS)]}; "
          f"per master: {dict(per_master)}")
    assert sorted(per_master) == cluster.masters()
    assert all(n > JOBS / CLUSTER_PARTITIONS * 0.9 for n in expected.values()), expected
    stats = store.stats()
    assert (stats["jobs"], stats["scheduled"]) == (JOBS, JOBS)
    # Staggered over the 300 s interval: about a third of a second's worth is due now.
    assert stats["due_next_hour"] == JOBS and stats["due_now"] < JOBS / 10

    for keys in store.parts:  # free the shared cluster's memory
        store.client.delete(*keys.all())
