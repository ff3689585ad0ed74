"""Print the OpenAPI document, as ``docs/openapi.json`` holds it:
``python -m celery_zsched.server.openapi > docs/openapi.json``."""

from __future__ import annotations

import sys

from celery_zsched.config import Settings
from celery_zsched.server.app import create_app
from celery_zsched.server.schema import document, render
from celery_zsched.store import Store


def main() -> None:
    """Print the document, as ``docs/openapi.json`` holds it."""
    # Building the document reads no setting and opens no connection: port 1 says so.
    app = create_app(Store.from_settings(Settings(redis_url="redis://127.0.0.1:1/0")))
    sys.stdout.write(render(document(app)))


if __name__ == "__main__":
    main()
