"""Placing jobs by domain: the directory, and moving a job whose home partition changed.

With pacing on and several partitions, a paced job lives in its domain's
partition (:mod:`.placement`), so an id alone no longer names its partition.
The directory (``Keys.directory``, in the id's own partition) does, for every
job placed away from it. Its rules, which hold on a Redis Cluster where the
entry and the job sit in different slots and cannot be written by one script:

* a new job: the directory entry first, then the job;
* a delete: the job first, then the entry (once nothing of the job is left);
* an entry whose partition holds no such job reads as absent;
* a move (a job whose domain, and so its home, changed): the job is taken out
  whole and parked in its old partition, the entry names the new one, the job
  is written there whole, then the parked record goes (``relocate.lua``); the
  new definition is written after. A crash anywhere leaves the job either
  parked or in one partition: never lost, never claimable twice. A parked job
  goes back where its stored definition belongs at the next write of any job
  (or ``zsched repartition``); the writer that died, unanswered, writes again.
  A job with an occurrence in flight does not move: its change is refused until
  it settles (:class:`MoveDeferred`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence

from celery_zsched.core.errors import ZSchedError
from celery_zsched.store import scripts
from celery_zsched.store.base import Call, unavailable
from celery_zsched.store.reads import Reads


class MoveDeferred(ZSchedError):
    """A job's change moves it to another partition, and an occurrence of it is in flight."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job {job_id!r}: its new domain places it in another partition, and an occurrence "
            "of it is queued or running; store the change again once it has settled")
        self.job_id = job_id


class Moves(Reads):
    """The directory's writes, and online moves between partitions."""

    def place(self, homes: Mapping[str, int]) -> set[str]:
        """Get each job of ``homes`` (id -> the partition it belongs in) ready to be written
        there: a new job gets its directory entry, a job stored elsewhere moves (whole).

        Returns the ids that cannot move now (an occurrence in flight): leave them out.
        """
        if not self.layout.by_domain or not homes:
            return set()
        where = self.locate(homes)
        away = {job_id: home for job_id, home in homes.items() if where[job_id] != home}
        if not away:
            return set()
        by_src: dict[int, list[str]] = defaultdict(list)
        for job_id in away:
            by_src[where[job_id]].append(job_id)
        calls: list[Call] = [(scripts.RELOCATE, self.parts[src],
                              [(job_id, away[job_id], "") for job_id in ids],
                              {"operation": "take"}) for src, ids in by_src.items()]
        records: dict[str, tuple[int, str, int]] = {}
        busy: set[str] = set()
        new: dict[str, int] = {}
        for (src, ids), reply in zip(by_src.items(), self._run(calls), strict=True):
            for job_id, answer in zip(ids, scripts.RELOCATE.reply(reply), strict=True):
                if answer == "busy":
                    busy.add(job_id)
                elif answer == "absent":
                    new[job_id] = away[job_id]
                else:
                    # (A move a crash interrupted goes where the job belongs now.)
                    records[job_id] = (src, answer, away[job_id])
        # Directory first: an entry with no job yet reads as absent.
        self._point(new)
        self._finish(records)
        return busy

    def _point(self, homes: Mapping[str, int]) -> None:
        """Make the directory name ``homes`` (id -> partition); an id at home needs no entry."""
        if not homes:
            return
        pipe = self.client.pipeline(transaction=False)
        for job_id, home in homes.items():
            own = self.id_part(job_id)
            if home == own:
                pipe.hdel(self.parts[own].directory, job_id)
            else:
                pipe.hset(self.parts[own].directory, job_id, str(home))
        pipe.execute()
        for job_id in homes:
            self.forget(job_id)

    def _finish(self, records: Mapping[str, tuple[int, str, int]]) -> None:
        """Steps 2 to 4 of a move, for parked ``records`` (id -> (old partition, JSON,
        new partition))."""
        if not records:
            return
        target = {job_id: to for job_id, (_, _, to) in records.items()}
        self._point(target)
        by_dst: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
        by_src: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
        for job_id, (src, raw, _) in records.items():
            by_dst[target[job_id]].append((job_id, target[job_id], raw))
            by_src[src].append((job_id, 0, ""))
        self._run([(scripts.RELOCATE, self.parts[dst], rows, {"operation": "restore"})
                   for dst, rows in by_dst.items()])
        self._run([(scripts.RELOCATE, self.parts[src], rows, {"operation": "drop"})
                   for src, rows in by_src.items()])

    @unavailable
    def resume_moves(self) -> int:
        """Finish the moves a crash interrupted (records parked in ``moving``); how many."""
        if not self.layout.by_domain:
            return 0
        parked = self._pipeline_each(lambda pipe, keys: pipe.hgetall(keys.moving))
        # The parked definition is the one stored: the new one never was (its writer
        # died, unanswered, and writes it again). So the job goes where that one
        # belongs, paced under the domain its state names.
        records = {str(job_id): (src, str(raw),
                                 self.layout.home_of(str(job_id), json.loads(raw)["def"]))
                   for src, (found,) in enumerate(parked) for job_id, raw in found.items()}
        self._finish(records)
        return len(records)

    def unpoint_deleted(self, ids: Sequence[str]) -> None:
        """After a delete: drop the directory entries of ``ids`` of which nothing is left
        (an occurrence still in flight keeps its state, and its entry, until it lands)."""
        if not self.layout.by_domain or not ids:
            return
        where = self.locate(ids)
        away = [job_id for job_id in ids if where[job_id] != self.id_part(job_id)]
        if not away:
            return
        pipe = self.client.pipeline(transaction=False)
        for job_id in away:
            pipe.hexists(self.parts[where[job_id]].defs, job_id)
            pipe.hexists(self.parts[where[job_id]].state, job_id)
        found = pipe.execute()
        gone = {job_id: self.id_part(job_id) for i, job_id in enumerate(away)
                if not found[2 * i] and not found[2 * i + 1]}
        self._point(gone)
