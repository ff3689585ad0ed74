"""Task ids: the deterministic name of each attempt of each occurrence."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from celery_zsched.store import TASK_ID_NAMESPACE, task_id_for


@given(job_id=st.text(max_size=40), occurrence=st.integers(-(2**63), 2**63),
       attempt=st.integers(0, 10**6))
def test_task_id_is_uuid5_of_the_occurrence(job_id: str, occurrence: int, attempt: int) -> None:
    """task_id_for, written out for speed, names a message as uuid5 always has."""
    expected = uuid.uuid5(TASK_ID_NAMESPACE, f"{job_id}:{occurrence}:{attempt}")
    assert task_id_for(job_id, occurrence, attempt) == str(expected)
