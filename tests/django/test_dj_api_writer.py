"""The REST API in a Django deployment (ModelWriter): every change lands in the row and in
Redis, so reconcile afterwards changes nothing.

A real uvicorn server in a thread, on the Django app's store, with the test
database shared by its worker threads (hence transactional tests).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from celery_zsched.contrib.django import conf
from celery_zsched.contrib.django.api_writer import ModelWriter
from celery_zsched.contrib.django.audit import drain_changes
from celery_zsched.contrib.django.models import ZSchedJob, ZSchedJobChange
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core.audit import Actor
from celery_zsched.core.job import Job
from celery_zsched.store import Store
from tests.gateway.conftest import (  # noqa: F401  (serve: a fixture)
    LEASE_SECRET,
    REPO,
    TOKENS,
    WRITER,
    Served,
    serve,
    serve_process,
    stop_process,
)
from tests.gateway.test_api_jobs import URL, _create
from tests.helpers import free_port

pytestmark = pytest.mark.django_db(transaction=True)

#: What the audit trail names the WRITER token by (auth.token_fingerprint).
WRITER_NAME = f"token {hashlib.sha256(WRITER.encode()).hexdigest()[:12]}"


@pytest.fixture
def api(serve: Callable[..., Served], settings: Any) -> Served:  # noqa: F811
    settings.CELERY_ZSCHED_API_TOKENS = TOKENS
    settings.CELERY_ZSCHED_GATEWAY_LEASE_SECRET = LEASE_SECRET
    conf.reset()
    return serve(store=conf.get_store(), writer=ModelWriter())


def _client(api: Served) -> httpx.Client:
    return api.client(WRITER)


def _assert_agree(store: Store, job_id: str) -> ZSchedJob:
    """The row and Redis hold one definition, and reconcile finds nothing to do."""
    row = ZSchedJob.objects.get(job_id=job_id)
    assert store.get(job_id).job.to_json() == row.to_job().to_json()
    _assert_reconciled()
    return row


def _assert_reconciled() -> None:
    report = reconcile()
    assert (report.changed, report.deleted, report.missing, report.invalid) == (0, 0, 0, []), \
        report.lines()


# ------------------------------------------------------------ one job's life
def test_create_edit_pause_resume_delete_keep_row_and_redis_in_agreement(api: Served) -> None:
    created = _create(api, name="first", queue="eu")
    job_id = created["id"]
    assert _assert_agree(api.store, job_id).name == "first"
    path = f"/v1/jobs/{job_id}"
    with _client(api) as client:
        edited = client.patch(path, json={"name": "second", "cron": "0 3 * * *"})
        assert edited.status_code == 200, edited.text
        assert edited.json()["definition"]["cron"] == "0 3 * * *"
        row = _assert_agree(api.store, job_id)
        assert (row.name, row.cron, row.kind) == ("second", "0 3 * * *", "cron")

        paused = client.patch(path, json={"status": "paused"})
        assert paused.status_code == 200 and paused.json()["state"]["status"] == "paused"
        assert api.store.get(job_id).paused
        assert not _assert_agree(api.store, job_id).enabled
        # The tag of a paused job's stored definition still opens a PATCH.
        renamed = client.patch(path, json={"name": "third"},
                               headers={"If-Match": paused.headers["etag"]})
        assert renamed.status_code == 200, renamed.text
        assert _assert_agree(api.store, job_id).name == "third"
        assert api.store.get(job_id).paused

        resumed = client.patch(path, json={"status": "active"})
        assert resumed.json()["state"]["status"] == "scheduled"
        assert _assert_agree(api.store, job_id).enabled

        assert client.delete(path).status_code == 204
        assert client.get(path).status_code == 404
    assert not ZSchedJob.objects.filter(job_id=job_id).exists()
    assert api.store.get_many([job_id]) == [None]
    _assert_reconciled()


def test_changes_are_recorded_as_made_by_api_and_the_token_fingerprint(api: Served) -> None:
    job_id = _create(api)["id"]
    with _client(api) as client:
        assert client.patch(f"/v1/jobs/{job_id}", json={"name": "x"}).status_code == 200
        assert client.patch(f"/v1/jobs/{job_id}", json={"status": "paused"}).status_code == 200
    drain_changes()
    trail = list(ZSchedJobChange.objects.filter(job_id=job_id).order_by("at", "stream_id")
                 .values_list("action", "actor_kind", "actor_name"))
    assert trail == [("create", "api", WRITER_NAME), ("edit", "api", WRITER_NAME),
                     ("pause", "api", WRITER_NAME)]


def test_a_create_has_written_redis_when_it_returns(zstore: Store) -> None:
    # Outside any transaction (autocommit), the signal's on_commit push runs at once.
    job = Job.from_dict({"id": "direct", "url": URL, "interval_s": 60})
    assert ModelWriter().create(job, Actor("api", "t"))
    assert zstore.get("direct").job.url == URL
    assert not ModelWriter().create(job, Actor("api", "t"))


# -------------------------------------------------------------- conflicts
def test_a_create_of_an_id_only_redis_has_is_409_and_writes_no_row(api: Served) -> None:
    api.store.upsert(Job.from_dict({"id": "beat-1", "url": URL}), static=True)
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"id": "beat-1", "url": URL, "name": "mine"})
    assert res.status_code == 409, res.text
    assert not ZSchedJob.objects.filter(job_id="beat-1").exists()
    assert api.store.get("beat-1").job.name != "mine"


def test_concurrent_creates_of_one_id_give_one_201_and_one_409(api: Served) -> None:
    rounds = 8

    def post(name: str, job_id: str, barrier: threading.Barrier) -> int:
        with _client(api) as client:
            barrier.wait(5)
            res = client.post("/v1/jobs", json={"id": job_id, "url": URL, "name": name})
            return res.status_code

    statuses: list[list[int]] = []
    for n in range(rounds):
        barrier = threading.Barrier(2)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            statuses.append(sorted(pool.map(post, ["a", "b"], [f"race-{n}"] * 2,
                                            [barrier] * 2)))
    assert statuses == [[201, 409]] * rounds
    for n in range(rounds):
        _assert_agree(api.store, f"race-{n}")


def test_a_stale_tag_writes_nothing_to_the_row_or_redis(api: Served) -> None:
    created = _create(api, name="first")
    job_id, stale = created["id"], f'"{created["etag"]}"'
    with _client(api) as client:
        assert client.patch(f"/v1/jobs/{job_id}", json={"name": "second"},
                            headers={"If-Match": stale}).status_code == 200
        res = client.patch(f"/v1/jobs/{job_id}", json={"name": "third"},
                           headers={"If-Match": stale})
    assert res.status_code == 412
    assert _assert_agree(api.store, job_id).name == "second"
    assert api.store.get(job_id).job.name == "second"
    job = api.store.get(job_id).job
    assert not ModelWriter().replace(job, created["etag"], Actor("api", "t"))


def test_the_tag_is_checked_against_the_row_not_redis(api: Served) -> None:
    # update() sends no signal: the row moved on, Redis still has the old definition.
    job_id = _create(api, name="first")["id"]
    ZSchedJob.objects.filter(job_id=job_id).update(name="from the database")
    redis_tag = api.store.get(job_id).tag
    with _client(api) as client:
        res = client.patch(f"/v1/jobs/{job_id}", json={"queue": "eu"},
                           headers={"If-Match": f'"{redis_tag}"'})
    assert res.status_code == 412
    row = ZSchedJob.objects.get(job_id=job_id)
    assert (row.name, row.queue) == ("from the database", "")


# ------------------------------------------------------- jobs only in Redis
def test_a_redis_only_job_is_adopted_by_an_edit_and_deleted_by_a_delete(api: Served) -> None:
    for job_id in ("old-1", "old-2"):
        api.store.upsert(Job.from_dict({"id": job_id, "url": URL, "interval_s": 60}))
    with _client(api) as client:
        assert client.patch("/v1/jobs/old-1", json={"name": "kept"}).status_code == 200
        assert client.delete("/v1/jobs/old-2").status_code == 204
    assert _assert_agree(api.store, "old-1").name == "kept"
    assert api.store.get_many(["old-2"]) == [None]


def test_a_beat_schedule_job_pauses_in_redis_without_a_row(api: Served) -> None:
    api.store.upsert(Job.from_dict({"id": "beat-1", "url": URL}), static=True)
    with _client(api) as client:
        assert client.patch("/v1/jobs/beat-1", json={"status": "paused"}).status_code == 200
    assert api.store.get("beat-1").paused
    assert not ZSchedJob.objects.exists()
    assert reconcile().static_kept == 1


# ------------------------------------------------------------------ import
def test_an_import_writes_rows_and_redis_staggered_and_reimports_as_updates(
        api: Served) -> None:
    rows = [{"id": f"site-{n}", "url": f"https://site{n}.example/", "interval_s": 100,
             "jitter_s": 0} for n in range(60)]
    now = api.store.now_ms()
    with _client(api) as client:
        res = client.post("/v1/jobs:import", json=rows)
        assert res.status_code == 200, res.text
        assert (res.json()["created"], res.json()["updated"]) == (60, 0)
        rows[0]["queue"] = "eu"
        again = client.post("/v1/jobs:import", json=rows)
    assert (again.json()["created"], again.json()["updated"], again.json()["total"]) == (0, 60, 60)
    assert ZSchedJob.objects.count() == 60
    assert ZSchedJob.objects.get(job_id="site-0").queue == "eu"
    assert api.store.get("site-0").job.queue == "eu"
    dues = sorted(int(score) for _, score in api.store.client.zrange(
        api.store.keys.schedule, 0, -1, withscores=True))
    assert len(dues) == 60 and dues[-1] - now > 80_000  # spread over the interval
    _assert_reconciled()
    drain_changes()
    actors = set(ZSchedJobChange.objects.values_list("actor_kind", "actor_name"))
    assert actors == {("api", WRITER_NAME)}


def test_a_create_of_a_row_redis_lacks_is_refused_by_the_unique_id(api: Served) -> None:
    # bulk_create sends no signal: the row exists, Redis has no job. Only the
    # database's unique job_id can refuse this create.
    ZSchedJob.objects.bulk_create([ZSchedJob.from_job(
        Job.from_dict({"id": "row-only", "url": URL, "interval_s": 60}))])
    with _client(api) as client:
        res = client.post("/v1/jobs", json={"id": "row-only", "url": URL, "name": "mine"})
    assert res.status_code == 409, res.text
    assert ZSchedJob.objects.get(job_id="row-only").name == ""
    assert api.store.get_many(["row-only"]) == [None]


# ------------------------------------------------------------ zsched serve
@pytest.mark.parametrize(("django_settings", "args", "line"), [
    ("tests.django_settings", (), "REST API writes: Django models (db alias default)"),
    ("tests.django_settings", ("--writer", "store"), "REST API writes: Redis store"),
    (None, (), "REST API writes: Redis store"),
])
def test_zsched_serve_writes_django_models_in_a_django_project(
        redis_url: str, django_settings: str | None, args: tuple[str, ...], line: str) -> None:
    proc = serve_process(redis_url, "{djserve}:", free_port(), django_settings=django_settings,
                         args=args)
    output = stop_process(proc)
    assert line in output.splitlines(), output


def test_zsched_serve_refuses_the_django_writer_without_django() -> None:
    env = {**os.environ, "ZSCHED_REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.cli_app", "zsched", "serve",
         "--port", str(free_port()), "--writer", "django"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--writer django: Django is not configured" in done.stdout + done.stderr
