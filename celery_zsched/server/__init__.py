"""The HTTP server of ``zsched serve``: one ASGI app, one router per concern.

- :mod:`.gateway`: the job gateway (``/jobs/...``), for workers in any language;
- :mod:`.auth`: bearer tokens and their scopes, shared by every router;
- :mod:`.dispatcher`: the long-poll hand-out (one per server process);
- :mod:`.app`: the app that puts them together; :mod:`.runner` serves it.

FastAPI and uvicorn are the ``server`` extra: nothing here is imported by the
scheduler or the workers.
"""

from __future__ import annotations
