"""Print the Celery stack the publish parity tests run on; with pins, insist on them.

Run by tox's parity-oldest and parity-newest before tests/test_publish.py:
``python tests/parity_versions.py celery==5.4.0 kombu==5.4.0`` fails unless
exactly those versions are installed (so a raised lower bound in pyproject.toml
cannot silently upgrade the "oldest" environment).
"""

from __future__ import annotations

import sys
from importlib import metadata

STACK = ("celery", "kombu", "redis", "amqp")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(pins: list[str]) -> int:
    installed = {name: _version(name) for name in STACK}
    print("publish parity on", ", ".join(f"{k} {v}" for k, v in installed.items()))
    wrong = [f"{name}=={want} (found {_version(name)})"
             for name, _, want in (pin.partition("==") for pin in pins)
             if _version(name) != want]
    if wrong:
        print("not the pinned versions:", ", ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
