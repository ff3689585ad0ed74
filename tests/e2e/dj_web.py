"""A Django "web" process for the end-to-end outbox tests (``python -m tests.e2e.dj_web``).

It reads one JSON command per line on stdin and answers one JSON line on
stdout, making the changes a web request would make, as the admin user
``alice``: ``migrate``; ``save`` (create, or update the row of ``job_id``, with
``fields``); ``save_then_die`` (the same, then SIGKILL itself right after the
commit and before the push: the first on-commit callback of the transaction);
``delete``; ``pause`` / ``resume`` (the admin's action); ``state`` (rows and
outbox entries). Django is configured by ``DJANGO_SETTINGS_MODULE`` and
``DATABASE_URL``, the store by the ``ZSCHED_*`` variables of the deployment.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any


def main() -> None:
    import django

    django.setup()
    from celery_zsched.contrib.django import audit
    from celery_zsched.core.audit import Actor

    alice = Actor("admin", "alice")
    for line in sys.stdin:
        command = json.loads(line)
        with audit.acting(alice, command.get("note", "")):
            answer = handle(command)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def handle(command: dict[str, Any]) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import transaction

    from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
    from celery_zsched.contrib.django.operations import apply_operation

    op = command["op"]
    if op == "migrate":
        call_command("migrate", verbosity=0, interactive=False)
        return {"ok": True}
    if op in ("save", "save_then_die"):
        with transaction.atomic():
            if op == "save_then_die":
                # Registered first, so it runs first once the transaction commits.
                transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
            row = ZSchedJob.objects.filter(job_id=command.get("job_id") or "").first()
            row = row or ZSchedJob()
            for name, value in command.get("fields", {}).items():
                setattr(row, name, value)
            row.full_clean()
            row.save()
        return {"job_id": row.job_id, "version": row.version}
    if op == "delete":
        deleted, _ = ZSchedJob.objects.filter(job_id=command["job_id"]).delete()
        return {"deleted": deleted}
    if op in ("pause", "resume"):
        result = apply_operation(op, ZSchedJob.objects.filter(job_id=command["job_id"]))
        return {"rows": result.rows, "changed": result.changed, "pending": result.pending}
    if op == "state":
        rows = {row.job_id: {"version": row.version, "enabled": row.enabled,
                             "interval_s": row.interval_s}
                for row in ZSchedJob.objects.all()}
        entries = list(ZSchedOutbox.objects.order_by("id").values_list(
            "job_id", "action", "attempts"))
        return {"rows": rows, "outbox": entries}
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
