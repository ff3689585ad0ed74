"""``manage.py zsched_sync``: reconcile Redis with the database (also rebuilds a wiped Redis)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.contrib.django.progress import Progress
from celery_zsched.contrib.django.sync import reconcile
from celery_zsched.core.errors import ZSchedError


class Command(BaseCommand):
    help = ("Make Redis match the database: add missing jobs (staggered), update changed "
            "ones, delete dynamic jobs that have no row, refresh the runtime mirror.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="Show the differences; write nothing.")
        parser.add_argument("--keep-unknown", action="store_true",
                            help="Do not delete Redis jobs that have no database row.")

    def handle(self, *args: Any, **options: Any) -> None:
        progress = Progress(self.stderr._out, enabled=options["verbosity"] > 0)
        try:
            report = reconcile(dry_run=options["dry_run"], prune=not options["keep_unknown"],
                               progress=progress)
        except ZSchedError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] == 0:  # -v 0: nothing on success, errors still raise
            return
        for line in report.lines():
            self.stdout.write(line)
