"""CPU-bound jobs run in parallel: the same jobs on 1 worker process, then on one per core.

Worker processes each have their own interpreter and GIL, so pure-Python CPU work spreads
across cores, which worker threads could not do. Each job counts the primes below 200,000
by trial division (about a third of a second on one core). The script runs ``JOBS`` of them
with ``Scheduler.map`` on ``Scheduler(workers=1)``, then on ``Scheduler(workers=N)`` with
``N = os.cpu_count()`` (at least 2, at most ``JOBS``), and prints the wall-clock times
(start-up excluded), the speed-up and the distinct worker pids that ran the jobs.

Run it: ``python examples/cpu_speedup.py``
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from mpsched import Scheduler

JOBS = 8
LIMIT = 200_000
PRIMES_BELOW_LIMIT = 17_984


class PrimeCount(NamedTuple):
    """What a job returns: its answer, who computed it and how long it took there."""

    primes: int
    worker_pid: int
    seconds: float


class Run(NamedTuple):
    """One pass of all jobs on one scheduler."""

    workers: int
    startup: float  # seconds until the Scheduler was ready
    wall: float  # seconds from the first submit to the last result
    counts: list[PrimeCount]


def count_primes(limit: int) -> PrimeCount:
    """The job: count the primes below ``limit`` by trial division, in pure Python."""
    started = time.perf_counter()
    count = 1 if limit > 2 else 0  # 2, the only even prime
    for n in range(3, limit, 2):
        divisor = 3
        while divisor * divisor <= n:
            if n % divisor == 0:
                break
            divisor += 2
        else:
            count += 1
    return PrimeCount(count, os.getpid(), time.perf_counter() - started)


def run_all(workers: int) -> Run:
    """Start a scheduler with ``workers`` processes and map all jobs onto it."""
    begun = time.perf_counter()
    with Scheduler(workers=workers) as s:
        ready = time.perf_counter()
        counts = list(s.map(count_primes, [LIMIT] * JOBS, timeout=60))
        done = time.perf_counter()
    return Run(workers, ready - begun, done - ready, counts)


def describe(run: Run) -> str:
    pids = sorted({c.worker_pid for c in run.counts})
    label = f"{run.workers} worker" + ("s" if run.workers > 1 else "")
    return (
        f"{label:>10}: {run.wall:5.2f} s wall for {len(run.counts)} jobs on "
        f"{len(pids)} pid{'s' if len(pids) > 1 else ''} {pids}  "
        f"(start-up {run.startup:.2f} s, not counted)"
    )


def main() -> int:
    cores = os.cpu_count() or 1
    parallel = min(max(2, cores), JOBS)
    serial_run = run_all(1)
    job_seconds = sum(c.seconds for c in serial_run.counts) / JOBS
    print(
        f"{JOBS} jobs, each counting the primes below {LIMIT:,} in pure Python "
        f"({job_seconds:.2f} s each on one core); os.cpu_count() = {cores}\n"
    )
    print(describe(serial_run))
    parallel_run = run_all(parallel)
    print(describe(parallel_run))
    speedup = serial_run.wall / parallel_run.wall
    ideal = min(parallel, cores)
    print(
        f"\nspeed-up: {speedup:.2f}x with {parallel} workers (ideal about {ideal:.2f}x "
        f"on {cores} core{'s' if cores > 1 else ''})"
    )
    wrong = [
        c.primes
        for r in (serial_run, parallel_run)
        for c in r.counts
        if c.primes != PRIMES_BELOW_LIMIT
    ]
    if wrong:
        print(f"✗ wrong prime counts {wrong}, expected {PRIMES_BELOW_LIMIT}")
        return 1
    if len({c.worker_pid for c in parallel_run.counts}) < 2:
        print(f"✗ all jobs ran on one worker although {parallel} were started")
        return 1
    print(f"✓ every job found {PRIMES_BELOW_LIMIT:,} primes; the work spread over processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
