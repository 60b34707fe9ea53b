"""The SQLite job store on its own: submit rate and recovery time.

Run: ``.venv/bin/python -m benchmarks.bench_store [--submit N] [--recover N] [--dir DIR]``.

- submit: N small jobs (32-byte payloads) in calls of 512 jobs from one thread, then the
  same from 4 threads at once, for ``durability="sync"`` and ``"process"``; jobs/s and the
  number of commits (group commit merges concurrent calls).
- lease: each of N jobs is leased (durable) and finished (queued) in turn, from 1 and from
  4 threads: what a worker's take costs once leases are journaled.
- recover: a store holding N pending jobs is opened and ``recover()`` returns them all;
  seconds from the constructor to the list (the issue's target: 1,000,000 in <= 10 s).

Not part of ``benchmarks/run.py`` (yet): it prints its table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from typing import Literal

from mpsched._core.job import JobState
from mpsched._store.base import StoredJob
from mpsched._store.sqlite import SQLiteStore

# The str forms SQLiteStore's durability takes.
DurabilityName = Literal["sync", "process"]
DURABILITIES: tuple[DurabilityName, ...] = ("sync", "process")

BATCH = 512


def jobs(start: int, count: int) -> list[StoredJob]:
    now = time.time()
    return [
        StoredJob(
            f"job-{i:08d}-5f0e3b1a",
            "client-1",
            None,
            "bench:noop",
            b"p" * 32,
            2,
            now + i % 1000,
            i,
            None,
            0,
            0,
            now,
        )
        for i in range(start, start + count)
    ]


def submit_rate(
    directory: str, durability: DurabilityName, total: int, threads: int
) -> tuple[float, int]:
    path = os.path.join(directory, f"submit-{durability}-{threads}.db")
    share = total // threads
    batches = [
        [jobs(t * share + b, min(BATCH, share - b)) for b in range(0, share, BATCH)]
        for t in range(threads)
    ]
    with SQLiteStore(path, durability=durability) as store:

        def run(mine: list[list[StoredJob]]) -> None:
            for batch in mine:
                store.submit(batch)

        workers = [threading.Thread(target=run, args=(b,)) for b in batches]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        return share * threads / elapsed, store.commits


def lease_rate(
    directory: str, durability: DurabilityName, total: int, threads: int
) -> tuple[float, int]:
    path = os.path.join(directory, f"lease-{durability}-{threads}.db")
    with SQLiteStore(path, durability=durability) as store:
        for start in range(0, total, BATCH):
            store.submit(jobs(start, min(BATCH, total - start)))
        before = store.commits

        def run(thread: int) -> None:
            for i in range(thread, total, threads):
                store.lease(f"job-{i:08d}-5f0e3b1a", f"worker-{thread}", 1)
                store.finish(f"job-{i:08d}-5f0e3b1a", JobState.DONE, b"r", time.time())

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        store.flush()
        return total / (time.perf_counter() - started), store.commits - before


def recovery_time(directory: str, total: int) -> tuple[float, int]:
    path = os.path.join(directory, "recover.db")
    with SQLiteStore(path, durability="process") as store:
        for start in range(0, total, 20 * BATCH):
            store.submit(jobs(start, min(20 * BATCH, total - start)))
    started = time.perf_counter()
    with SQLiteStore(path) as store:
        recovered = store.recover()
        elapsed = time.perf_counter() - started
    return elapsed, len(recovered.pending)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submit", type=int, default=100_000)
    parser.add_argument("--lease", type=int, default=5_000)
    parser.add_argument("--recover", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a tmp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for durability in DURABILITIES:
            for threads in (1, 4):
                rate, commits = submit_rate(directory, durability, args.submit, threads)
                print(
                    f"submit {args.submit} jobs, {durability:7}, {threads} thread(s): "
                    f"{rate:9,.0f} jobs/s, {commits} commits"
                )
        for durability in DURABILITIES:
            for threads in (1, 4):
                rate, commits = lease_rate(directory, durability, args.lease, threads)
                print(
                    f"lease+finish {args.lease} jobs, {durability:7}, {threads} thread(s): "
                    f"{rate:9,.0f} jobs/s, {commits} commits"
                )
        elapsed, count = recovery_time(directory, args.recover)
        print(f"recover {count:,} pending jobs: {elapsed:.2f} s")


if __name__ == "__main__":
    main()
