"""``manage.py serve_targets [--port 8000] [--hosts H ...]``: the fake sites.

runserver listens on one address; the sample jobs fetch from many (see
:mod:`scrapers.hosts`), each a separate domain to the scheduler's pacing. This
serves the project on all of them from one process, a thread per request,
until it is stopped (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.servers.basehttp import (
    ThreadedWSGIServer,
    WSGIRequestHandler,
    get_internal_wsgi_application,
)
from django.urls import get_resolver

from scrapers.hosts import TARGET_HOSTS


class Command(BaseCommand):
    help = "Serve the fake scrape targets on every loopback host the sample jobs use."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000,
                            help="port on every host (default 8000, as runserver's)")
        parser.add_argument("--hosts", nargs="+", default=list(TARGET_HOSTS), metavar="HOST",
                            help="addresses to listen on (default: those of scrapers.hosts)")

    def handle(self, *args: Any, port: int, hosts: list[str], **options: Any) -> None:
        app = get_internal_wsgi_application()
        # Load the URLconf (and so the views) now: the flaky target counts its
        # downtime from the moment its module is imported.
        get_resolver().url_patterns  # noqa: B018
        servers: list[ThreadedWSGIServer] = []
        try:
            for host in hosts:
                servers.append(self._listen(host, port, app))
        except CommandError:
            for server in servers:
                server.server_close()
            raise
        for server in servers:
            threading.Thread(target=server.serve_forever, name=f"serve {server.server_address}",
                             daemon=True).start()
        self.stdout.write(f"serving on port {port} of {', '.join(hosts)}", ending="\n")
        self.stdout.flush()
        try:
            threading.Event().wait()  # until Ctrl-C; SIGTERM just ends the process
        except KeyboardInterrupt:
            pass
        finally:
            for server in servers:
                server.shutdown()
                server.server_close()

    @staticmethod
    def _listen(host: str, port: int, app: Any) -> ThreadedWSGIServer:
        try:
            server = ThreadedWSGIServer((host, port), WSGIRequestHandler)
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EADDRNOTAVAIL:
                # Linux routes all of 127.0.0.0/8 to lo; macOS only 127.0.0.1.
                hint = f" (on macOS first: sudo ifconfig lo0 alias {host} up)"
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
        server.set_app(app)
        return server
