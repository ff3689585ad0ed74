"""Redis stream ids (``<ms>-<seq>``), the one place they are taken apart.

A partitioned store labels an entry ``<partition>/<ms>-<seq>`` where entries
of several partitions' streams meet (run history, audit trail): both forms are
read here.
"""

from __future__ import annotations


def order(stream_id: str) -> tuple[int, int]:
    """(ms, sequence) of a stream id: the order Redis keeps its entries in."""
    ms, _, seq = stream_id.rpartition("/")[2].partition("-")
    return int(ms or 0), int(seq or 0)


def millis(stream_id: str) -> int:
    """When the entry was added: the ms part of its id (Redis' clock)."""
    return order(stream_id)[0]
