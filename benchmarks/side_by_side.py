"""Two commits side by side in one run: guard.py's figures and section 7's dispatch.

    python benchmarks/side_by_side.py BEFORE_DIR AFTER_DIR [--rounds N] [--jobs N]

Each DIR is a snapshot (``git archive REV | tar -x -C DIR``) measured from its own
directory with its own benchmark code, by the interpreter running this script, which must
not have mpsched installed in editable mode (its import hook wins over ``PYTHONPATH``).
Rounds alternate BEFORE and AFTER; each round runs ``benchmarks/guard.py`` (throughput
against ProcessPoolExecutor, lateness against ``sched``) and section 7's dispatch (no store,
``durability="sync"``, ``"process"``) for both. Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

DISPATCH = """
import json, sys, tempfile
from benchmarks import bench_durable
with tempfile.TemporaryDirectory() as d:
    print(json.dumps({str(k): bench_durable.run_dispatch(d, k, int(sys.argv[1]), 2)["jobs_per_s"]
                      for k in (None, "sync", "process")}))
"""


def _run(directory: str, argv: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": directory}
    done = subprocess.run(
        [sys.executable, *argv], cwd=directory, env=env, text=True, capture_output=True, timeout=600
    )
    return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="dispatch jobs per run")
    args = parser.parse_args(argv)
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for round_ in range(args.rounds):
        for label in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
            directory = getattr(args, label)
            out = _run(directory, ["benchmarks/guard.py", "--repeats", "1"])
            found = {
                "throughput x PPE": r"throughput: mpsched ([\d.]+)x",
                "lateness p99 ms": r"lateness p99: mpsched ([\d.]+) ms",
                "sched p99 ms": r"sched \(in-process\) ([\d.]+) ms",
            }
            for name, pattern in found.items():
                match = re.search(pattern, out)
                if match:
                    figures[label].setdefault(name, []).append(float(match.group(1)))
            rates = json.loads(_run(directory, ["-c", DISPATCH, str(args.jobs)]).splitlines()[-1])
            for key, name in (("sync", "sync / no store"), ("process", "process / no store")):
                figures[label].setdefault(name, []).append(rates[key] / rates["None"])
            figures[label].setdefault("no store jobs/s", []).append(rates["None"])
            print(label, round_, {k: v[-1] for k, v in figures[label].items()}, flush=True)
    for name in figures["before"]:
        before = statistics.median(figures["before"][name])
        after = statistics.median(figures["after"].get(name, [float("nan")]))
        print(f"{name}: before {before:.3f}, after {after:.3f} (medians of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
