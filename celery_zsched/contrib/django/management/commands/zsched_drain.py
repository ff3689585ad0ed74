"""``manage.py zsched_drain``: copy settle events into run history, then prune it."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.contrib.django.history import drain
from celery_zsched.core.errors import ZSchedError


class Command(BaseCommand):
    help = ("Copy new settle events from the Redis stream into run history and new "
            "audit entries into the job change history (idempotent), and delete run "
            "history older than CELERY_ZSCHED_HISTORY_DAYS.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--max-items", type=int, default=1_000_000,
                            help="Most events to copy in this run.")
        parser.add_argument("--no-prune", action="store_true", help="Keep old history.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = drain(options["max_items"], prune=not options["no_prune"])
        except ZSchedError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] == 0:  # -v 0: a cron job's run prints nothing when all is well
            return
        self.stdout.write(
            f"read {report.read} event(s), recorded {report.created} run(s), refreshed "
            f"{report.jobs_updated} job(s), recorded {report.changes} job change(s), "
            f"pruned {report.pruned} old run(s); "
            f"cursor {report.cursor}; took {report.seconds:.2f}s")
