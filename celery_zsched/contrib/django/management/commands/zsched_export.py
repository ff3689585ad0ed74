"""``manage.py zsched_export --file jobs.csv``: every job, as ``zsched_import`` reads it back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.contrib.django.bulk import export_jobs
from celery_zsched.core.errors import ZSchedError
from celery_zsched.core.formats import FORMATS, detect_format


class Command(BaseCommand):
    help = "Export every job as JSON, JSON Lines or CSV (to stdout by default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", "-f", help="Output file (default: stdout).")
        parser.add_argument("--format", choices=FORMATS,
                            help="Format (default: from --file's suffix; jsonl on stdout).")

    def handle(self, *args: Any, **options: Any) -> None:
        path: str | None = options["file"]
        invalid: list[str] = []
        try:
            fmt = detect_format(path, options["format"]) if path else options["format"] or "jsonl"
            if path:
                with Path(path).open("w", encoding="utf-8", newline="") as fp:
                    count = export_jobs(fp, fmt, invalid=invalid)
            else:
                count = export_jobs(self.stdout._out, fmt, invalid=invalid)
        except (ZSchedError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        for line in invalid:
            self.stderr.write(f"left out invalid job {line}")
        # -v 0 keeps the warnings above (jobs left out) but drops the summary.
        if options["verbosity"] > 0:
            self.stderr.write(f"exported {count} job(s)" + (f" to {path}" if path else ""))
