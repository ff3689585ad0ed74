"""Write the example's sample jobs: ``python make_sample_jobs.py [--port P] [--count N]``.

``sample_jobs.json`` was made with the defaults. The mix is deterministic (a
seeded RNG), so the file only changes when this script does. ``demo.py``
calls :func:`sample_jobs` with its ``--port``.

The jobs fetch from several loopback hosts (:mod:`scrapers.hosts`), each a
separate site to the scheduler's per-domain pacing: the rate-limited and the
flaky targets have a site each, the other pages share 24 healthy ones.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

# Run as a script or imported by demo.py: either way this directory is on sys.path.
from scrapers.hosts import host_for

DEFAULT_PORT = 8000
#: (target kind, share of the jobs): mostly healthy feeds, a few of each problem.
#: The rate-limited site gets few jobs: it serves two requests per Retry-After.
MIX = (("feed", 0.81), ("slow", 0.07), ("error", 0.05), ("ratelimited", 0.03),
       ("flaky", 0.04))
LABELS = {"feed": "Feed", "slow": "Slow feed", "error": "Broken feed",
          "ratelimited": "Rate-limited feed", "flaky": "Flaky feed"}
CRONS = ("*/2 * * * *", "*/5 * * * *", "*/15 * * * *", "0 * * * *", "30 8-18 * * 1-5")
INTERVALS = (30, 45, 60, 90, 120, 180, 300, 600)


def sample_jobs(port: int = DEFAULT_PORT, count: int = 1000,
                seed: int = 7) -> list[dict[str, Any]]:
    """``count`` import rows fetching ``http://<host>:<port>/targets/...``, mixed as
    :data:`MIX` says, on the host :func:`scrapers.hosts.host_for` gives each."""
    rng = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    rows: list[dict[str, Any]] = []
    for n in range(1, count + 1):
        kind = rng.choices(kinds, weights)[0]
        row: dict[str, Any] = {
            "url": f"http://{host_for(kind, n)}:{port}/targets/{kind}/{n}.xml",
            "name": f"{LABELS[kind]} {n}",
            "meta": {"feed": n, "target": kind, "lang": rng.choice(("de", "en", "fr"))},
        }
        if rng.random() < 0.2:
            # Cron jobs run on Berlin's wall clock, DST included.
            row["cron"] = rng.choice(CRONS)
            row["timezone"] = "Europe/Berlin"
        else:
            row["interval_s"] = rng.choice(INTERVALS)
        if rng.random() < 0.4:
            row["jitter_s"] = rng.choice((5, 10, 30))
        if kind == "slow":
            row["queue"] = "celery"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Write the rows as a JSON array (to ``-o`` or stdout)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
    # One row a line: readable, diffable, and a fifth of the size of indent=2.
    rows = sample_jobs(args.port, args.count)
    text = "[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
