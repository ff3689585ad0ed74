"""``manage.py zsched_import --file jobs.csv``: validate, then bulk-create rows and upsert Redis.

``--from django-celery-beat`` or ``--from redbeat`` moves another scheduler's
entries instead (see :mod:`...source_import`).
"""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.contrib.django.bulk import ImportSummary, import_jobs
from celery_zsched.contrib.django.progress import Progress
from celery_zsched.contrib.django.source_import import SOURCES, import_source, read_source
from celery_zsched.core.errors import ImportValidationError, StoreUnavailable, ZSchedError
from celery_zsched.core.formats import FORMATS
from celery_zsched.services.sources import SwitchPlan


class Command(BaseCommand):
    help = ("Import jobs from a JSON, JSON Lines or CSV file, or from django-celery-beat or "
            "redbeat (--from). Every row is validated first; if any is bad, nothing is "
            "written (unless --skip-invalid).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", "-f", help="File to import.")
        parser.add_argument("--from", dest="source", choices=SOURCES,
                            help="Move the entries of this scheduler instead of a file; "
                                 "each job's next run is the one that scheduler would have made.")
        parser.add_argument("--redbeat-prefix",
                            help="redbeat's redbeat_key_prefix (default: "
                                 "CELERY_REDBEAT_KEY_PREFIX, else 'redbeat:').")
        parser.add_argument("--redbeat-url",
                            help="Redis URL of redbeat's keys (default: the zsched Redis).")
        parser.add_argument("--format", choices=FORMATS,
                            help="File format (default: from the file's suffix).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Validate and report what would change; write nothing.")
        parser.add_argument("--update", action="store_true",
                            help="Overwrite jobs whose id already exists (default: skip them; "
                                 "--from always updates).")
        parser.add_argument("--skip-invalid", action="store_true",
                            help="Import the valid rows and report the invalid ones.")

    def handle(self, *args: Any, **options: Any) -> None:
        if bool(options["file"]) == bool(options["source"]):
            raise CommandError("give either --file or --from")
        progress = Progress(self.stderr._out, enabled=options["verbosity"] > 0)
        summary: ImportSummary | SwitchPlan
        try:
            if options["source"]:
                summary = self._from_source(options, progress)
            else:
                summary = import_jobs(
                    options["file"], options["format"], dry_run=options["dry_run"],
                    update=options["update"], skip_invalid=options["skip_invalid"],
                    progress=progress)
        except ImportValidationError as exc:
            raise CommandError(str(exc)) from exc
        except StoreUnavailable as exc:
            if options["source"]:
                # Redis is read before the database is written, so a failure may
                # come before or after the commit: a re-run writes what is missing.
                raise CommandError(f"{exc}. Run this command again once Redis is back; "
                                   "it writes only what is missing.") from exc
            raise CommandError(f"{exc}. The rows are saved in the database; run "
                               "`manage.py zsched_sync` once Redis is back.") from exc
        except ZSchedError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] == 0:  # -v 0: nothing on success, errors still raise
            return
        for line in summary.lines():
            self.stdout.write(line)

    def _from_source(self, options: dict[str, Any], progress: Progress) -> SwitchPlan:
        try:
            read = read_source(options["source"], redbeat_prefix=options["redbeat_prefix"],
                               redbeat_url=options["redbeat_url"])
        except redis.RedisError as exc:
            # Nothing is written yet: say so, unlike a failure after the commit.
            raise CommandError(f"cannot read redbeat's entries: {exc}; nothing written") from exc
        return import_source(read, dry_run=options["dry_run"],
                             skip_invalid=options["skip_invalid"], progress=progress)
