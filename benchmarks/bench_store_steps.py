"""The SQLite store's CPU per job, step by step (a budget, not a comparison; not run by run.py).

Each measurement on a fresh store in a temporary directory:

* the store alone: 20,000 jobs submitted in batches of 100, then each one leased and
  finished (as the manager does), CPU of this process per job;
* the wall-clock wait of each lease among 20,000 (each job finished after it), longest and
  99.9th percentile: the lease log changes regions every ~2,300 leases, and a take must
  not wait for that;
* one SQLite commit per lease (what a lease cost before the lease log) against one write to
  the lease log;
* a batch of row updates as ``executemany()`` against one multi-row ``UPDATE ... FROM
  (VALUES ...)``, alone and with one busy Python thread (the sqlite3 module lets go of the
  GIL around every step, and each step then waits to get it back);
* a finish's row update (one statement per batch of 50) on the schema as it is, without
  each of its indexes in turn, and with the row found by its rowid (seq) instead of its id;
* row updates in batches of every size from 10 to 150 rows, as one statement per batch
  (each size a new statement to prepare) and as ``execute_rows`` runs them (statements of
  a power of two of rows, each prepared once);
* a prune of 60,000 finished jobs out of 120,000, as one DELETE and as the writer prunes,
  in steps of ``PRUNE_STEP`` rows (a step is what a batch may wait for).

Run: ``python -m benchmarks.bench_store_steps``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pickle
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

from mpsched._core.job import JobState
from mpsched._store.base import StoredJob
from mpsched._store.commit import ROWS_PER_STATEMENT, execute_rows
from mpsched._store.file import MIGRATIONS
from mpsched._store.lease_log import LeaseLog
from mpsched._store.lease_records import LogRecord
from mpsched._store.pruning import PRUNE_ROWS as _PRUNE_STEP
from mpsched._store.pruning import PRUNE_STEP
from mpsched._store.sqlite import SQLiteStore
from mpsched._store.statements import FINISH_LEASED as _FINISH_LEASED
from mpsched._store.statements import PRUNE as _PRUNE

# The str forms SQLiteStore's durability takes.
DurabilityName = Literal["sync", "process"]
DURABILITIES: tuple[DurabilityName, ...] = ("process", "sync")

JOBS = 20_000
_runs = itertools.count()  # one new file per measurement


def _jobs(count: int) -> list[StoredJob]:
    now = time.time()
    payload = pickle.dumps(("benchmarks.jobs", "noop", (), {}))
    return [
        StoredJob(
            f"client-{n}",
            "client",
            None,
            "benchmarks.jobs:noop",
            payload,
            2,
            now,
            n,
            None,
            0,
            0,
            now,
        )
        for n in range(count)
    ]


def store_alone(directory: str, durability: DurabilityName) -> tuple[float, float]:
    """CPU µs per job: submitting, then leasing and finishing."""
    store = SQLiteStore(os.path.join(directory, f"alone-{next(_runs)}.db"), durability=durability)
    try:
        jobs = _jobs(JOBS)
        outcome = pickle.dumps(("client-0", True, b"\x80\x05N.", "", 0.0, None))
        start = time.process_time()
        for at in range(0, JOBS, 100):
            store.submit(jobs[at : at + 100])
        submitted = time.process_time()
        for job in jobs:
            store.lease(job.job_id, "worker-1", 1)
            store.finish(job.job_id, JobState.DONE, outcome, time.time())
        store.flush()
        ended = time.process_time()
    finally:
        store.close()
    return (submitted - start) / JOBS * 1e6, (ended - submitted) / JOBS * 1e6


def lease_waits(directory: str, durability: DurabilityName) -> tuple[float, float]:
    """Wall-clock ms of the longest lease and the 99.9th percentile, over JOBS leases (each
    job finished after it): what a take may wait for in the store, region changes of the
    lease log included."""
    store = SQLiteStore(os.path.join(directory, f"waits-{next(_runs)}.db"), durability=durability)
    try:
        jobs = _jobs(JOBS)
        for at in range(0, JOBS, 100):
            store.submit(jobs[at : at + 100])
        outcome = pickle.dumps(("client-0", True, b"\x80\x05N.", "", 0.0, None))
        waits: list[float] = []
        for job in jobs:
            start = time.perf_counter()
            store.lease(job.job_id, "worker-1", 1)
            waits.append(time.perf_counter() - start)
            store.finish(job.job_id, JobState.DONE, outcome, time.time())
    finally:
        store.close()
    waits.sort()
    return waits[-1] * 1e3, waits[int(len(waits) * 0.999)] * 1e3


def _connection(path: str, jobs: int = JOBS) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN")
    for step in MIGRATIONS:
        step(conn)
    conn.execute("COMMIT")
    rows = [job[:12] for job in _jobs(jobs)]
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO jobs (job_id, client_id, key, name, payload, priority, "
        "due_wall, seq, timeout, retries, attempt, submitted_wall, state) "
        f"VALUES ({', '.join('?' * 12)}, 'pending')",
        rows,
    )
    conn.execute("COMMIT")
    return conn


def lease_costs(directory: str) -> tuple[float, float]:
    """CPU µs per lease: one SQLite commit each (NORMAL), one lease log write each."""
    conn = _connection(os.path.join(directory, f"commit-{next(_runs)}.db"))
    start = time.process_time()
    for n in range(JOBS):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE jobs SET state = 'running', worker_id = ?, attempt = ? WHERE job_id = ?",
            ("worker-1", 1, f"client-{n}"),
        )
        conn.execute("COMMIT")
    commit = (time.process_time() - start) / JOBS * 1e6
    conn.close()
    log = LeaseLog(os.path.join(directory, "leases"), sync=False, flush=lambda: None)
    log.reset()
    start = time.process_time()
    for n in range(JOBS):
        log.append(LogRecord(f"client-{n}", True, 1, "worker-1"), lambda: None)
    write = (time.process_time() - start) / JOBS * 1e6
    log.release(remove=True)
    return commit, write


@contextmanager
def _busy_thread(on: bool) -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin) if on else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()


def update_costs(directory: str, busy: bool, batch: int = 50) -> dict[str, float]:
    """CPU µs of this thread per row updated, by executemany and by one statement."""
    results: dict[str, float] = {}
    ways: dict[str, Callable[[sqlite3.Connection, Sequence[Sequence[object]]], object]] = {
        "executemany": lambda conn, rows: conn.executemany(_FINISH_LEASED.one, rows),
        "one statement": lambda conn, rows: conn.execute(
            _FINISH_LEASED.many(len(rows)), [v for row in rows for v in row]
        ),
    }
    for name, run in ways.items():
        conn = _connection(os.path.join(directory, f"update-{next(_runs)}.db"))
        with _busy_thread(busy):
            start = time.thread_time()
            for at in range(0, JOBS, batch):
                rows = [
                    ("done", b"y" * 60, 1.0, "worker-1", 1, f"client-{n}")
                    for n in range(at, min(JOBS, at + batch))
                ]
                conn.execute("BEGIN IMMEDIATE")
                run(conn, rows)
                conn.execute("COMMIT")
            results[name] = (time.thread_time() - start) / JOBS * 1e6
        conn.close()
    return results


_ENDS = """CREATE TABLE ends (seq INTEGER PRIMARY KEY, state TEXT NOT NULL, outcome BLOB,
    finished_wall REAL NOT NULL, worker_id TEXT, attempt INTEGER NOT NULL);
    CREATE INDEX ends_finished ON ends (finished_wall);"""


def _into_ends(rows: int) -> str:
    """A finish as a row of a table of ends (the job's row found by its id), n at once."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    return (
        "INSERT INTO ends SELECT j.seq, v.column1, v.column2, v.column3, v.column4, "
        f"v.column5 FROM (VALUES {values}) AS v JOIN jobs AS j ON j.job_id = v.column6"
    )


def finish_variants(directory: str, batch: int = 50) -> dict[str, float]:
    """CPU µs per row of the finish's row update (one statement per batch), on the schema as
    it is and without each index in turn, with the row found by rowid (seq), and written
    instead as a row of a table of ends (no row of jobs rewritten)."""
    by_seq = lambda n: _FINISH_LEASED.many(n).replace("jobs.job_id =", "jobs.seq =")  # noqa: E731
    variants: dict[str, tuple[str | None, Callable[[int], str], bool]] = {
        "as is": (None, _FINISH_LEASED.many, False),
        "without jobs_state": ("DROP INDEX jobs_state", _FINISH_LEASED.many, False),
        "without jobs_key": ("DROP INDEX jobs_key", _FINISH_LEASED.many, False),
        "without jobs_finished": ("DROP INDEX jobs_finished", _FINISH_LEASED.many, False),
        "by seq": (None, by_seq, True),
        "into a table of ends": (_ENDS, _into_ends, False),
    }
    results: dict[str, float] = {}
    for name, (prepare, sql, seq) in variants.items():
        conn = _connection(os.path.join(directory, f"finish-{next(_runs)}.db"))
        if prepare is not None:
            conn.executescript(prepare)
        start = time.thread_time()
        for at in range(0, JOBS, batch):
            rows = [
                ("done", b"y" * 60, 1.0, "worker-1", 1, n if seq else f"client-{n}")
                for n in range(at, min(JOBS, at + batch))
            ]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql(len(rows)), [v for row in rows for v in row])
            conn.execute("COMMIT")
        results[name] = (time.thread_time() - start) / JOBS * 1e6
        conn.close()
    return results


def size_costs(directory: str) -> dict[str, float]:
    """CPU µs of this thread per row updated in batches of 10, 11, ..., 150 rows (each size
    once, as batches come): one statement per batch (a new statement, prepared, for each),
    and ``execute_rows`` (statements of a power of two of rows: a handful, each prepared
    once)."""
    sizes = range(10, 151)
    ways: dict[str, Callable[[sqlite3.Connection, Sequence[Sequence[object]]], object]] = {
        "a statement per size": lambda conn, rows: conn.execute(
            _FINISH_LEASED.many(len(rows)), [v for row in rows for v in row]
        ),
        "powers of two": lambda conn, rows: execute_rows(
            conn, _FINISH_LEASED.many, rows, ROWS_PER_STATEMENT
        ),
    }
    results: dict[str, float] = {}
    for name, run in ways.items():
        conn = _connection(os.path.join(directory, f"sizes-{next(_runs)}.db"))
        at = 0
        start = time.thread_time()
        for size in sizes:
            rows = [
                ("done", b"y" * 60, 1.0, "worker-1", 1, f"client-{n}") for n in range(at, at + size)
            ]
            conn.execute("BEGIN IMMEDIATE")
            run(conn, rows)
            conn.execute("COMMIT")
            at += size
        results[name] = (time.thread_time() - start) / at * 1e6
        conn.close()
    return results


def prune_costs(directory: str, rows: int = 60_000) -> tuple[float, float, float]:
    """Seconds to prune ``rows`` finished jobs (a minute of them at 1,000 jobs/s) of a
    store holding twice as many: as one DELETE; and the median and the longest of the
    writer's steps of ``PRUNE_STEP`` rows, each a transaction."""
    whole = 0.0
    steps: list[float] = []
    for stepwise in (False, True):
        conn = _connection(os.path.join(directory, f"prune-{next(_runs)}.db"), 2 * rows)
        conn.execute("BEGIN")
        conn.execute(
            "UPDATE jobs SET state = 'done', outcome = ?, finished_wall = seq", (b"y" * 60,)
        )
        conn.execute("COMMIT")
        while True:
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            if stepwise:
                deleted = conn.execute(_PRUNE_STEP, (rows - 1, PRUNE_STEP)).rowcount
            else:
                deleted = conn.execute(_PRUNE, (rows - 1,)).rowcount
            conn.execute("COMMIT")
            if not stepwise:
                whole = time.perf_counter() - start
                break
            steps.append(time.perf_counter() - start)
            if deleted < PRUNE_STEP:
                break
        conn.close()
    return whole, statistics.median(steps), max(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"SQLite {sqlite3.sqlite_version}, {JOBS:,} jobs, median of {args.repeats}")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        for durability in DURABILITIES:
            runs = [store_alone(directory, durability) for _ in range(args.repeats)]
            print(
                f"store alone, {durability}: submit "
                f"{statistics.median(r[0] for r in runs):.1f} µs, lease + finish "
                f"{statistics.median(r[1] for r in runs):.1f} µs of CPU per job"
            )
        for durability in DURABILITIES:
            waits = [lease_waits(directory, durability) for _ in range(args.repeats)]
            print(
                f"a lease's wait, {durability}: longest "
                f"{statistics.median(w[0] for w in waits):.2f} ms, 99.9th percentile "
                f"{statistics.median(w[1] for w in waits):.3f} ms of {JOBS:,}"
            )
        leases = [lease_costs(directory) for _ in range(args.repeats)]
        print(
            f"a lease: SQLite commit (NORMAL) {statistics.median(r[0] for r in leases):.1f}"
            f" µs, lease log write {statistics.median(r[1] for r in leases):.1f} µs of CPU"
        )
        for busy in (False, True):
            runs_ = [update_costs(directory, busy) for _ in range(args.repeats)]
            cells = ", ".join(
                f"{name} {statistics.median(r[name] for r in runs_):.1f} µs" for name in runs_[0]
            )
            print(
                f"row updates, batches of 50, {'one busy thread' if busy else 'alone'}: "
                f"{cells} of CPU per row"
            )
        finishes = [finish_variants(directory) for _ in range(args.repeats)]
        cells = ", ".join(
            f"{name} {statistics.median(r[name] for r in finishes):.1f} µs" for name in finishes[0]
        )
        print(f"a finish's row update, batches of 50, alone: {cells} of CPU per row")
        by_size = [size_costs(directory) for _ in range(args.repeats)]
        cells = ", ".join(
            f"{name} {statistics.median(r[name] for r in by_size):.1f} µs" for name in by_size[0]
        )
        print(f"row updates, batches of 10 to 150 rows, alone: {cells} of CPU per row")
        prunes = [prune_costs(directory) for _ in range(args.repeats)]
        print(
            f"a prune of 60,000 finished jobs: {statistics.median(p[0] for p in prunes):.3f}"
            f" s as one DELETE; in steps of {PRUNE_STEP} rows, "
            f"{statistics.median(p[1] for p in prunes) * 1e3:.1f} ms a step, the longest "
            f"{statistics.median(p[2] for p in prunes) * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
