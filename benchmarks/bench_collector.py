"""The garbage collector in a long-running manager: two commits side by side.

    python benchmarks/bench_collector.py BEFORE_DIR AFTER_DIR [--rounds N] [--seconds S]

A manager without a store keeps the jobs that ended for ``result_ttl`` (a day by default),
at most 100,000 of them. Each run fills that memory with 100,000 no-op jobs, then feeds a
steady stream: 1,000 jobs of 1 ms a second for ``--seconds``, each submitted two seconds
before it is due (``schedule(at=...)``, from a feeder thread in the client), on
2 workers. Meanwhile another thread submits ``--later`` no-op jobs due in an hour, evenly,
50 at a time: the jobs a day's schedule queues up. It reports the stream's lateness (a
job's start, ``time.time()`` in the job, minus its instant) and every full (generation 2)
collection of the manager during the stream, timed by a ``gc.callbacks`` hook that this
script puts on the manager's ``PYTHONPATH`` (a ``sitecustomize`` that writes each pause to
a file named after its pid).

Each DIR is a snapshot (``git archive REV | tar -x -C DIR``). The runs use this file's
code and import mpsched (and ``benchmarks.jobs``) from the DIR. Rounds alternate BEFORE
and AFTER. Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from functools import partial
from pathlib import Path
from typing import Any

HOOK = """
import gc, os, time
_dir = os.environ.get("MPSCHED_BENCH_GC_DIR")
if _dir:
    _start = [0.0]
    def _timed(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            _start[0] = time.perf_counter()
            return
        pause = time.perf_counter() - _start[0]
        with open(os.path.join(_dir, str(os.getpid())), "a") as f:
            f.write(f"{time.monotonic()} {pause}\\n")
    gc.callbacks.append(_timed)
"""
PREFILL = 100_000
RATE = 1_000  # jobs a second
JOB_SECONDS = 0.001
AHEAD = 2.0  # seconds from a job's submit to its instant: room for the submits before it
WORKERS = 2
LATER = 60_000  # jobs due in an hour, submitted evenly during the stream
LATER_GROUP = 50  # submitted together


def run_once(seconds: float, prefill: int, later_jobs: int) -> dict[str, float]:
    """One run, in this process, with mpsched from ``sys.path``; the hook must be on it."""
    import mpsched
    from benchmarks._common import percentiles
    from benchmarks.jobs import burn, calibrate_burn, noop
    from mpsched import Scheduler

    if not Path(mpsched.__file__).is_relative_to(Path.cwd()):  # run from the DIR measured
        raise SystemExit(f"mpsched imported from {mpsched.__file__}, not {Path.cwd()}")
    pauses_dir = os.environ["MPSCHED_BENCH_GC_DIR"]
    loops = calibrate_burn(JOB_SECONDS)
    jobs = int(seconds * RATE)
    late: list[float] = []  # appended by the client's result thread
    with Scheduler(workers=WORKERS) as s:
        manager = s._manager_process.pid
        for done in range(0, prefill, 10_000):
            wait_futures([s.submit(noop) for _ in range(min(10_000, prefill - done))])
        first = time.time() + AHEAD + 0.5
        ats = [first + i / RATE for i in range(jobs)]
        later: list[Future[Any]] = []
        streamed: list[Future[Any]] = []

        def on_end(at: float, future: Future[Any]) -> None:
            late.append(future.result()[0] - at)

        def feed() -> None:
            for at in ats:
                lead = at - AHEAD - time.time()
                if lead > 0:
                    time.sleep(lead)
                future = s.schedule(burn, loops, at=at)
                future.add_done_callback(partial(on_end, at))
                streamed.append(future)

        def queue_up() -> None:  # jobs for later, submitted evenly while the stream runs
            for i in range(0, later_jobs, LATER_GROUP):
                time.sleep(max(0.0, first + i / later_jobs * seconds - time.time()))
                later.extend(s.schedule(noop, delay=3600) for _ in range(LATER_GROUP))

        threads = [threading.Thread(target=feed), threading.Thread(target=queue_up)]
        start = time.monotonic() + (first - time.time())  # of the stream, on the manager's clock
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wait_futures(streamed, timeout=seconds + 120)
        end = time.monotonic()
        for future in later:
            future.cancel()
        s.shutdown(wait=True, cancel_futures=True)
    pauses = []
    path = Path(pauses_dir, str(manager))
    if path.exists():
        for line in path.read_text().splitlines():
            when, pause = (float(x) for x in line.split())
            if start <= when <= end:
                pauses.append(pause)

    ranked = percentiles(late)  # nearest rank, as every section's
    ordered = sorted(late)
    p999 = ordered[min(len(ordered) - 1, math.ceil(0.999 * len(ordered)) - 1)]
    return {
        "late_p50_ms": ranked["p50"] * 1e3,
        "late_p99_ms": ranked["p99"] * 1e3,
        "late_p999_ms": p999 * 1e3,
        "late_max_ms": ranked["max"] * 1e3,
        "full_collections": float(len(pauses)),
        "full_pause_max_ms": max(pauses, default=0.0) * 1e3,
        "full_pause_total_ms": sum(pauses) * 1e3,
    }


def _run(
    directory: str, hook_dir: str, seconds: float, prefill: int, later_jobs: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as pauses_dir:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([hook_dir, directory]),
            "MPSCHED_BENCH_GC_DIR": pauses_dir,
        }
        argv = [sys.executable, __file__, "--one", str(seconds), str(prefill), str(later_jobs)]
        done = subprocess.run(
            argv, cwd=directory, env=env, text=True, capture_output=True, timeout=seconds + 600
        )
    if done.returncode != 0:
        raise SystemExit(f"run failed in {directory}:\n{done.stdout}{done.stderr}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="of the stream")
    parser.add_argument("--prefill", type=int, default=PREFILL, help="no-op jobs run first")
    parser.add_argument(
        "--later", type=int, default=LATER, help="jobs due in an hour, submitted meanwhile"
    )
    parser.add_argument("--one", nargs=3, type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_once(args.one[0], int(args.one[1]), int(args.one[2]))))
        return 0
    if not (args.before and args.after):
        parser.error("BEFORE_DIR and AFTER_DIR are required")
    figures: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(HOOK)
        for round_ in range(args.rounds):
            for label in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
                run = _run(getattr(args, label), hook_dir, args.seconds, args.prefill, args.later)
                figures[label].append(run)
                shown = " ".join(f"{k}={v:.2f}" for k, v in run.items())
                print(f"round {round_ + 1} {label:6} {shown}", flush=True)
    for label, runs in figures.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"median {label:6} " + " ".join(f"{k}={v:.2f}" for k, v in medians.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
