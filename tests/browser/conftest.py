"""Fixtures of the browser and example-project tests.

Django is pointed at the session's throwaway redis-server by the
``zsched_redis`` and ``zstore`` fixtures of tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Screenshots and logs a person can look at after the run (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture
def artifacts() -> Path:
    """``artifacts/`` at the repository root, created on demand."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
