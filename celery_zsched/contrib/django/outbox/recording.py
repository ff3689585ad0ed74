"""Recording a change: its outbox entry, in the transaction of the change itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.utils import timezone as dj_timezone

from celery_zsched.contrib.django.models import ZSchedJob, ZSchedOutbox
from celery_zsched.contrib.django.sync import IN_CHUNK, batched
from celery_zsched.core.audit import Actor

#: The actions of :class:`~celery_zsched.contrib.django.models.SyncAction`.
SAVE, DELETE, PAUSE, RESUME = "save", "delete", "pause", "resume"


def record(job_ids: Sequence[str], action: str, *, using: str, by: Actor, note: str = "",
           columns: dict[str, Any] | None = None) -> int:
    """Record a change of each of ``job_ids`` in the outbox; returns its version.

    Call it inside the transaction that changes the rows, once it holds their
    locks (it wrote them, or selected them ``FOR UPDATE``): a later change of
    the same job then gets a larger version. Every row but a deleted one gets
    the version in its ``version`` column, and ``columns`` in the same UPDATE.
    One INSERT (``executemany``) and one UPDATE per 900 rows, whatever the action.
    """
    if not job_ids:
        return 0
    with transaction.atomic(using=using, savepoint=False):
        version = _insert_entries(job_ids, action, using, by, note)
        if action != DELETE:
            for part in batched(job_ids, IN_CHUNK):
                ZSchedJob.objects.using(using).filter(job_id__in=part).update(
                    version=version, **(columns or {}))
    return version


#: The columns an entry is written with (``id`` and ``dead_at`` take their defaults).
_ENTRY_COLUMNS = ("job_id", "action", "actor_kind", "actor_name", "note", "created_at",
                  "attempts", "next_try_at", "last_error")


def _insert_entries(job_ids: Sequence[str], action: str, using: str, by: Actor,
                    note: str) -> int:
    """INSERT one entry per job (one ``executemany``); the version: the last entry's id.

    A parametrised statement rather than ``bulk_create``, whose per-value
    compilation cost 1 s for 10,000 entries. Ids grow within a connection's
    inserts, so the last job's newest entry is the newest of this change (a
    later one of that job would need the row lock this transaction holds).
    """
    meta = ZSchedOutbox._meta
    connection = connections[using]
    quote = connection.ops.quote_name
    now = dj_timezone.now()
    values = {"action": action, "actor_kind": by.kind, "actor_name": by.name, "note": note,
              "created_at": now, "attempts": 0, "next_try_at": now, "last_error": ""}
    fixed = [meta.get_field(name).get_db_prep_save(values[name], connection)
             for name in _ENTRY_COLUMNS[1:]]
    table, key, job = quote(meta.db_table), quote(meta.pk.column), quote("job_id")
    columns = ", ".join(quote(meta.get_field(name).column) for name in _ENTRY_COLUMNS)
    marks = ", ".join(["%s"] * len(_ENTRY_COLUMNS))
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                           [[job_id, *fixed] for job_id in job_ids])
        cursor.execute(f"SELECT MAX({key}) FROM {table} WHERE {job} = %s", [job_ids[-1]])
        row = cursor.fetchone()
    return int(row[0])


def write_rows(job_ids: Sequence[str], columns: dict[str, Any], action: str, *, using: str,
               by: Actor, note: str = "") -> tuple[list[str], int]:
    """Set ``columns`` on the rows of ``job_ids`` that differ, and record the change.

    In one transaction: the rows that differ are selected ``FOR UPDATE`` (900
    at a time), then updated, version and columns in one UPDATE per 900 rows.
    Returns the ids whose rows changed and the change's version (0 if none did).
    """
    changed: list[str] = []
    with transaction.atomic(using=using, savepoint=False):
        for part in batched(job_ids, IN_CHUNK):
            changed += ZSchedJob.objects.using(using).filter(job_id__in=part) \
                .exclude(**columns).select_for_update().values_list("job_id", flat=True)
        version = record(changed, action, using=using, by=by, note=note, columns=columns)
    return changed, version

