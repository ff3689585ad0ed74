"""``manage.py zsched_stats``: jobs by state, due soon, lateness percentiles, dead letters."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from celery_zsched.contrib.django.outbox import status
from celery_zsched.contrib.django.stats import collect, lines, outbox_lines
from celery_zsched.core.errors import ZSchedError


class Command(BaseCommand):
    help = ("Show jobs by state, jobs due in the next minute and hour, p50/p95/p99 "
            "lateness of recent runs, dead letters, throttled domains, and the changes "
            "not in Redis yet (outbox), with a warning when the oldest is too old.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--window", type=int, default=60,
                            help="Minutes of recent runs for the percentiles.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            stats = collect(window_minutes=options["window"])
        except ZSchedError as exc:
            # Redis is down: what is waiting for it still matters, most of all now.
            for line in outbox_lines(status().as_dict()):
                self.stderr.write(line)
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(stats, indent=2, sort_keys=True))
        else:
            for line in lines(stats):
                self.stdout.write(line)
