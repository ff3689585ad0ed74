"""``manage.py zsched_import --file jobs.csv``: validate, then bulk-create rows and upsert Redis."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.errors import ImportValidationError, StoreUnavailable, ZSchedError
from celery_zsched.importer import FORMATS

from ...bulk import import_jobs
from ...progress import Progress


class Command(BaseCommand):
    help = ("Import jobs from a JSON, JSON Lines or CSV file. Every row is validated first; "
            "if any is bad, nothing is written (unless --skip-invalid).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", "-f", required=True, help="File to import.")
        parser.add_argument("--format", choices=FORMATS,
                            help="File format (default: from the file's suffix).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Validate and report what would change; write nothing.")
        parser.add_argument("--update", action="store_true",
                            help="Overwrite jobs whose id already exists (default: skip them).")
        parser.add_argument("--skip-invalid", action="store_true",
                            help="Import the valid rows and report the invalid ones.")

    def handle(self, *args: Any, **options: Any) -> None:
        progress = Progress(self.stderr._out, enabled=options["verbosity"] > 0)
        try:
            summary = import_jobs(
                options["file"], options["format"], dry_run=options["dry_run"],
                update=options["update"], skip_invalid=options["skip_invalid"],
                progress=progress)
        except ImportValidationError as exc:
            raise CommandError(str(exc)) from exc
        except StoreUnavailable as exc:
            raise CommandError(f"{exc}. The rows are saved in the database; run "
                               "`manage.py zsched_sync` once Redis is back.") from exc
        except ZSchedError as exc:
            raise CommandError(str(exc)) from exc
        for line in summary.lines():
            self.stdout.write(line)
