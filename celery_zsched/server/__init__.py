"""The HTTP server of ``zsched serve``: one ASGI app, one router per concern.

- :mod:`.gateway`: the job gateway (``/jobs/...``), for workers in any language;
- :mod:`.auth`: bearer tokens and their scopes, shared by every router;
- :mod:`.dispatcher`: the long-poll hand-out (one per server process);
- :mod:`.lease`: the lease tokens workers echo back;
- :mod:`.bodies` and :mod:`.problems`: capped, strict request bodies and
  ``application/problem+json`` errors naming the field, for every router;
- :mod:`.app`: the app that puts them together; :mod:`.runner` serves it.

A further router (the management API) is one more module included in
:func:`.app.create_app`, with :func:`.auth.require` for its scopes.

FastAPI and uvicorn are the ``server`` extra: nothing here is imported by the
scheduler or the workers.
"""

from __future__ import annotations
