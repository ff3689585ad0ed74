"""``POST /v1/jobs:import`` of a 64 MiB body holds less than 4x the body in memory.

Measured on a real ``zsched serve`` process: its peak resident set (the kernel's
``VmHWM``) after the import, less its resident set before. The body is at the cap,
in CSV with every column (the shape that held 33x its size before), and as a JSON
array with a non-ASCII character in every row (a Python string of it would take up
to four bytes a character).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from celery_zsched.server.imports import MAX_IMPORT_BYTES
from security.conftest import Server
from tests.gateway.conftest import WRITER

pytestmark = pytest.mark.slow

#: What the import may hold at its peak, in multiples of the body.
BOUND = 4


def _row(n: int) -> dict[str, object]:
    return {"id": f"mem-{n:07d}", "url": f"https://host{n % 997}.example/feed/{n}?page=1",
            "task": "scrape", "name": f"feed number {n} \u2013 größer \U0001f600",
            "interval_s": 300 + n % 60,
            "jitter_s": 5, "queue": "eu", "routing_key": "eu.scrape", "priority": 3,
            "expires_s": 60, "enabled": True, "max_runs": 1000, "misfire_grace_s": 30,
            "retry_max": 2, "retry_base_s": 10, "timezone": "Europe/Berlin",
            "meta": {"source": "memory-test", "n": n}, "transport": "http"}


def _csv_body(size: int) -> bytes:
    columns = list(_row(0))
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    n, body = 0, bytearray(out.getvalue().encode())
    while True:
        out.seek(0)
        out.truncate()
        row = _row(n)
        writer.writerow([json.dumps(v) if isinstance(v, dict) else
                         ("true" if v is True else v) for v in row.values()])
        line = out.getvalue().encode()
        if len(body) + len(line) > size:
            return bytes(body)
        body += line
        n += 1


def _json_body(size: int) -> bytes:
    body, n = bytearray(b"["), 0
    while True:
        item = json.dumps(_row(n), ensure_ascii=False).encode()
        if len(body) + len(item) + 2 > size:
            body += b"]"
            return bytes(body)
        body += (b"," if n else b"") + item
        n += 1


def _peak_over(server: Server, body: bytes, fmt: str, dry_run: bool) -> tuple[int, dict]:
    process = psutil.Process(server.proc.pid)
    before = process.memory_info().rss
    with server.client(WRITER, timeout=600) as client:
        answer = client.post("/v1/jobs:import", content=body,
                             params={"format": fmt, "dry_run": dry_run})
    assert answer.status_code == 200, answer.text[:2000]
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    peak = int(next(line for line in status.splitlines()
                    if line.startswith("VmHWM:")).split()[1]) * 1024
    return peak - before, answer.json()


@pytest.mark.parametrize("fmt, dry_run", [("csv", False), ("json", True)])
def test_an_import_at_the_cap_holds_less_than_four_times_its_body(
        serve_process: Callable[..., Server], fmt: str, dry_run: bool) -> None:
    server = serve_process()
    body = (_csv_body if fmt == "csv" else _json_body)(MAX_IMPORT_BYTES)
    assert MAX_IMPORT_BYTES - 4096 < len(body) <= MAX_IMPORT_BYTES
    grown, result = _peak_over(server, body, fmt, dry_run)
    print(f"{fmt}: body {len(body) / 2**20:.1f} MiB, {result['total']} jobs, peak RSS "
          f"+{grown / 2**20:.0f} MiB ({grown / len(body):.2f}x the body)")
    assert result["total"] > 100_000
    assert grown < BOUND * len(body)
