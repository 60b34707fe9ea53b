"""Result latency: from a job's end in its worker to its future's end in the client.

    python -m benchmarks.bench_result_latency [--repeats N] [--lengths MS ...]

For each job length L (pure-Python CPU, ``spin`` calibrated on this process's CPU
clock), 2 workers run N jobs submitted at once (N x L = 2 s of work). A job returns
``time.time()`` as it ends; a done-callback on its future stamps ``time.time()`` in the
client. The gap is what a caller of ``as_completed`` or ``result()`` waits beyond the job
itself: its report, the manager's reply, the client's result thread. mpsched
(``Scheduler(workers=2)``) and ``ProcessPoolExecutor(max_workers=2)`` alternate within
each repeat; the table gives the median over repeats of each run's p50, p90 and max.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from functools import partial
from multiprocessing import get_context
from typing import Any

from benchmarks._common import Result, alternate, median, scheduler
from benchmarks.jobs import calibrate_burn, spin_then_stamp

WORKERS = 2
WORK_SECONDS = 2.0  # of jobs' CPU per run
LENGTHS_MS = (2.0, 10.0, 50.0)


def _measure(submit: Callable[..., Future[float]], jobs: int, loops: int) -> Result:
    lock = threading.Lock()  # guards gaps; the pool's result thread appends to it
    gaps: list[float] = []
    all_in = threading.Event()  # a done-callback may run after wait() has returned

    def done(future: Future[float]) -> None:
        now = time.time()
        with lock:
            gaps.append(now - future.result())
            if len(gaps) == jobs:
                all_in.set()

    for _ in range(jobs):
        submit(spin_then_stamp, loops).add_done_callback(done)
    if not all_in.wait(600):
        raise RuntimeError(f"only {len(gaps)} of {jobs} results came")
    gaps.sort()
    return {
        "p50_ms": 1e3 * statistics.median(gaps),
        "p90_ms": 1e3 * gaps[int(len(gaps) * 0.9)],
        "max_ms": 1e3 * gaps[-1],
    }


def _warm(submit: Callable[..., Future[Any]]) -> None:
    wait_futures([submit(spin_then_stamp, 1) for _ in range(20)])


def run_mpsched(jobs: int, loops: int) -> Result:
    with scheduler(workers=WORKERS) as s:
        _warm(s.submit)
        return _measure(s.submit, jobs, loops)


def run_process_pool(jobs: int, loops: int) -> Result:
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=get_context("fork")) as pool:
        _warm(pool.submit)
        return _measure(pool.submit, jobs, loops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=float, nargs="+", default=list(LENGTHS_MS))
    args = parser.parse_args(argv)
    rows = []
    for length_ms in args.lengths:
        loops = calibrate_burn(length_ms / 1e3)
        jobs = max(WORKERS, round(WORK_SECONDS / (length_ms / 1e3)))
        runs = alternate(
            [
                ("mpsched", partial(run_mpsched, jobs, loops)),
                ("ProcessPoolExecutor", partial(run_process_pool, jobs, loops)),
            ],
            args.repeats,
            f"result latency {length_ms:g} ms",
        )
        for name, results in runs.items():
            p50, p90, top = (
                median([r[k] for r in results]) for k in ("p50_ms", "p90_ms", "max_ms")
            )
            rows.append(
                f"| {jobs:,} x {length_ms:g} ms | {name} | {p50:.2f} | {p90:.2f} | {top:.1f} |"
            )
    print("| jobs | contender | p50 (ms) | p90 (ms) | max (ms) |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
