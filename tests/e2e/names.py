"""Names shared by the e2e Celery app (imported in subprocesses) and the tests.

The tests never import :mod:`tests.e2e.e2e_app` themselves: importing it builds a
Celery app from the environment and installs the worker's settle hooks, which
belongs in the worker processes only.
"""

from __future__ import annotations

#: ``-A`` argument of every beat and worker process.
APP_MODULE = "tests.e2e.e2e_app"
#: The scrape task, and the app's ``zsched_default_task``.
SCRAPE_TASK = "e2e.scrape"
#: Environment variables read by the e2e app (besides celery-zsched's ``ZSCHED_*``).
ENV_BROKER_URL = "E2E_BROKER_URL"
ENV_QUEUE = "E2E_QUEUE"
ENV_HTTP_TIMEOUT_S = "E2E_HTTP_TIMEOUT_S"
#: Name of the worker process (incarnation) that runs a task, set per worker.
ENV_WORKER_ID = "E2E_WORKER_ID"
#: Seconds after which a beat SIGKILLs itself between a claim and its publish (the
#: first non-empty batch from then on): a beat crash at the worst moment.
ENV_BEAT_DIE_AFTER_S = "E2E_BEAT_DIE_AFTER_S"
#: Seconds a pool process waits between accepting a task (which, acknowledging
#: early, acknowledges its message) and the start compare-and-set, after logging
#: ``START_DELAYED``: the window in which a killed worker tree leaves a message no
#: broker gives back and an occurrence that is not running.
ENV_START_DELAY_S = "E2E_START_DELAY_S"
#: What the worker logs as a start is held back (followed by the task id).
START_DELAYED = "e2e: start delayed"
#: "1": the app acknowledges late (``task_acks_late``); else early, Celery's default.
ENV_ACKS_LATE = "E2E_ACKS_LATE"
#: A second task of the app, never any job's: what a forged message may name.
OTHER_TASK = "e2e.other"
#: JSON of the app's static ``beat_schedule`` (schedules in seconds).
ENV_BEAT_SCHEDULE = "E2E_BEAT_SCHEDULE"
#: Query parameter through which the scrape task tells the target its Celery task id.
TASK_ID_PARAM = "tid"
#: Query parameter through which it names the worker (``E2E_WORKER_ID``) running it.
WORKER_ID_PARAM = "wid"
#: A file the app's processes append their spans to as JSON lines (``tests/spans.py``).
ENV_SPANS_FILE = "E2E_SPANS_FILE"
