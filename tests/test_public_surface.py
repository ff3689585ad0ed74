"""The public surface stays where projects find it, whatever moves inside the package.

- the import paths a project writes (``celery_zsched``, ``.worker``, ``.signals``,
  ``.errors``, the former ``.scheduler``, ``.contrib.django``);
- the entry points: ``-S celery_zsched`` (``celery.beat_schedulers``), ``celery -A
  proj zsched`` (``celery.commands``), and the two groups other distributions
  register under (``celery_zsched.extensions``, ``celery_zsched.notify_transports``);
- what importing the worker hooks or the scheduler costs: no web framework, no
  Django and no Prometheus client, checked in a fresh interpreter per import.

The ``--help`` of every command is pinned by ``tests/test_cli_help.py``; the Django
migrations by ``tests/django/test_dj_models.py`` (``makemigrations --check``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest
from celery.beat import Scheduler
from celery.utils.dispatch import Signal
from celery.utils.imports import symbol_by_name

import celery_zsched
from celery_zsched.beat.scheduler import ZSchedScheduler
from celery_zsched.core import errors as core_errors
from celery_zsched.services import extensions
from celery_zsched.services import signals as service_signals
from tests.cli_env import APP, ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
CELERY = str(Path(sys.executable).parent / "celery")

#: ``from celery_zsched import ...``: the names the Python API reference lists.
PACKAGE_EXPORTS = [
    "BrokerUnavailable", "ConfigurationError", "ImportValidationError", "Job", "JobFailed",
    "JobNotFound", "Settings", "Store", "StoreUnavailable", "ValidationError", "ZSchedError",
    "job_id_for_url", "task_id_for",
]
#: ``celery_zsched.errors``: the exception hierarchy, as it was before the layers.
ERRORS = ["ZSchedError", "ValidationError", "ImportValidationError", "ConfigurationError",
          "JobNotFound", "StoreUnavailable", "LayoutMismatch", "BrokerUnavailable", "JobFailed"]
#: ``celery_zsched.signals``: the signals and the events their receivers get.
SIGNALS = ["job_failed", "job_retries_exhausted", "job_dead_lettered", "job_failing_streak",
           "domain_breaker_opened"]
EVENTS = ["JobEvent", "BreakerEvent", "Event"]


# ------------------------------------------------------------------ import paths
def test_the_package_exports_what_the_python_reference_lists() -> None:
    assert sorted(celery_zsched.__all__) == sorted(PACKAGE_EXPORTS)
    reference = (ROOT / "docs" / "reference" / "python.md").read_text("utf-8")
    for name in PACKAGE_EXPORTS:
        assert f"`{name}" in reference, name


def test_the_package_exports_the_objects_of_their_homes() -> None:
    from celery_zsched import Job, JobFailed, Settings, Store, job_id_for_url, task_id_for
    from celery_zsched.config import Settings as settings_home
    from celery_zsched.core.job import Job as job_home
    from celery_zsched.core.job import job_id_for_url as job_id_home
    from celery_zsched.store import Store as store_home
    from celery_zsched.store import task_id_for as task_id_home

    assert (Job, Settings, Store) == (job_home, settings_home, store_home)
    assert (job_id_for_url, task_id_for) == (job_id_home, task_id_home)
    assert JobFailed is core_errors.JobFailed
    url = "https://example.com/"
    assert job_id_for_url(url) == hashlib.sha1(url.encode()).hexdigest()[:12]
    assert task_id_for("j", 1, 0) == task_id_for("j", 1, 0) != task_id_for("j", 1, 1)


@pytest.mark.parametrize("name", [*ERRORS, "FileError"])
def test_errors_keep_their_public_path(name: str) -> None:
    public = importlib.import_module("celery_zsched.errors")
    assert getattr(public, name) is getattr(core_errors, name)
    assert issubclass(getattr(public, name), core_errors.ZSchedError)


@pytest.mark.parametrize("name", SIGNALS + EVENTS)
def test_signals_keep_their_public_path(name: str) -> None:
    public = importlib.import_module("celery_zsched.signals")
    assert getattr(public, name) is getattr(service_signals, name)
    if name in SIGNALS:
        assert isinstance(getattr(public, name), Signal)


def test_the_worker_module_keeps_install_and_report() -> None:
    worker = importlib.import_module("celery_zsched.worker")
    assert callable(worker.install) and callable(worker.report)
    assert "outcome" in worker.report.__code__.co_varnames


@pytest.mark.parametrize("path", ["celery_zsched.scheduler:ZSchedScheduler",
                                  "celery_zsched.scheduler.ZSchedScheduler",
                                  "celery_zsched.beat.scheduler:ZSchedScheduler"])
def test_the_scheduler_resolves_from_the_beat_scheduler_setting(path: str) -> None:
    """``beat_scheduler = "celery_zsched.scheduler:ZSchedScheduler"`` (the path before
    the layers) keeps working: Celery resolves it with ``symbol_by_name``."""
    assert symbol_by_name(path) is ZSchedScheduler


def test_the_django_app_keeps_its_path() -> None:
    apps = importlib.import_module("celery_zsched.contrib.django.apps")
    assert apps.ZSchedConfig.name == "celery_zsched.contrib.django"
    assert apps.ZSchedConfig.label == "zsched"


# ------------------------------------------------------------------ entry points
def _one(group: str, name: str) -> object:
    found = list(entry_points(group=group, name=name))
    assert len(found) == 1, f"{group}:{name} is registered {len(found)} times"
    return found[0].load()


def test_the_installed_entry_points_are_the_pyproject_ones() -> None:
    """A stale editable install would test yesterday's entry points: if this fails,
    run ``pip install -e .`` again."""
    for group, points in PYPROJECT["project"]["entry-points"].items():
        installed = {p.name: p.value for p in entry_points(group=group)
                     if p.dist is not None and p.dist.name == "celery-zsched"}
        assert installed == points, group


def test_the_beat_schedulers_entry_point_loads_the_scheduler() -> None:
    loaded = _one("celery.beat_schedulers", "celery_zsched")
    assert loaded is ZSchedScheduler
    assert issubclass(ZSchedScheduler, Scheduler)


def test_the_celery_commands_entry_point_loads_the_zsched_group() -> None:
    from celery_zsched.cli import zsched

    loaded = _one("celery.commands", "zsched")
    assert loaded is zsched
    assert isinstance(loaded, click.Group) and loaded.name == "zsched"


def test_the_extensions_entry_points_load() -> None:
    groups = PYPROJECT["project"]["entry-points"]
    assert extensions.EXTENSIONS in groups and extensions.NOTIFY_TRANSPORTS in groups
    names = set(groups[extensions.EXTENSIONS])
    assert names >= {"notify", "metrics"}
    hooks = ("start", "stop", "beat_observer")  # extensions.Extension: each one optional
    for name in names:
        extension = _one(extensions.EXTENSIONS, name)
        provided = [hook for hook in hooks if callable(getattr(extension, hook, None))]
        assert provided, f"extension {name!r} has none of {hooks}"
    assert len(extensions.extensions()) >= len(names)


def test_the_notify_transports_entry_points_load() -> None:
    names = set(PYPROJECT["project"]["entry-points"][extensions.NOTIFY_TRANSPORTS])
    assert "mail" in names
    for name in names:
        assert callable(_one(extensions.NOTIFY_TRANSPORTS, name))
        assert extensions.notify_transport(name) is _one(extensions.NOTIFY_TRANSPORTS, name)


def _clean_env() -> dict[str, str]:
    """The environment without the developer's settings: no ``ZSCHED_*``, ``CELERY_*``
    and no ``DJANGO_SETTINGS_MODULE`` (with it, Celery's Django fix-up loads Django)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("ZSCHED_", "CELERY_")) and k != "DJANGO_SETTINGS_MODULE"}


def test_beat_takes_the_scheduler_option_in_a_real_celery() -> None:
    run = subprocess.run([CELERY, "-A", APP, "beat", "-S", "celery_zsched", "--help"],
                         cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "--scheduler" in run.stdout


def test_beat_resolves_dash_s_celery_zsched_to_the_scheduler() -> None:
    """What ``celery beat -S celery_zsched`` builds, in a fresh interpreter: Celery's
    ``beat.Service`` looks the name up among the ``celery.beat_schedulers`` entry points
    (lazy: no schedule set up, Redis not touched)."""
    code = ("from celery.beat import Service\n"
            f"from {APP} import app\n"
            "s = Service(app, scheduler_cls='celery_zsched').get_scheduler(lazy=True)\n"
            "print(type(s).__module__ + ':' + type(s).__qualname__)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "celery_zsched.beat.scheduler:ZSchedScheduler"


# ------------------------------------------------------------ what imports cost
#: What neither beat nor a worker may load (pyproject.toml's contract "Beat and
#: workers load no web framework, Django or Prometheus", checked here at run time).
HEAVY = ("fastapi", "starlette", "uvicorn", "django", "prometheus_client", "opentelemetry")
#: kombu's JSON encoder (``kombu.utils.json``, which every Celery process imports)
#: imports ``django.utils.functional`` whenever Django is installed, and redis-py 7+
#: (``redis.observability``) part of OpenTelemetry's metrics SDK whenever that is:
#: those are Celery's and redis-py's, not ours, so they are loaded first and subtracted
#: (the tracing API, its propagators and the Celery instrumentation stay counted).
_PROBE = """
import json, sys
HEAVY = {heavy!r}
def heavy():
    return {{m for m in sys.modules if m.partition(".")[0] in HEAVY}}
import kombu.utils.json
import redis
before = heavy()
{statement}
print(json.dumps({{"before": sorted(before), "after": sorted(heavy())}}))
"""


@pytest.mark.parametrize("statement", [
    "import celery_zsched.worker",
    "import celery_zsched.beat.scheduler",
    "import celery_zsched.scheduler",
    # What beat and every worker do at start: load the extensions entry points.
    "from celery_zsched.services import extensions; extensions.extensions()",
])
def test_importing_loads_no_web_framework_django_or_prometheus(statement: str) -> None:
    code = _PROBE.format(heavy=HEAVY, statement=statement)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert all(m.startswith(("django", "opentelemetry")) for m in seen["before"]), \
        seen["before"]
    assert sorted(set(seen["after"]) - set(seen["before"])) == [], statement
