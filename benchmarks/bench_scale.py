"""6. Scale: many pending jobs. Submit rate, memory per pending job, take() latency.

Three levels, each said in the table:

* JobQueue in a fresh spawned interpreter (clean heap): fill with N pending jobs (distinct
  ~80-byte payloads and ids, as the manager holds them), then time single ``take()`` +
  ``complete()`` calls while a replacement keeps N constant; once at N = ``big`` and once
  at N = 1,000. Memory per job = RSS growth / N. Peer: stdlib ``sched`` holding N events
  with the same payloads (insertion rate and memory only; it has no take()).
* mpsched processes: ``submit`` of M jobs due in an hour through the manager; rate and the
  manager's RSS growth per job. Peer: APScheduler 3 ``add_job`` of the same M one-hour
  jobs into its MemoryJobStore (in a fresh interpreter, RSS growth per job).
"""

from __future__ import annotations

import gc
import os
import sched
import statistics
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle

from benchmarks._common import (
    Result,
    Section,
    Target,
    alternate,
    column,
    in_fresh_process,
    median,
    ratios,
    rss_bytes,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop

TAKES = 2_000  # timed take() calls per measurement


def _payloads(count: int) -> Iterator[bytes]:
    base = cloudpickle.dumps((noop, (), {}))
    for i in range(count):
        yield base + i.to_bytes(8, "little")  # a distinct object per job, as unpickled


# ---------------------------------------------------------- JobQueue, in-process


def queue_fill_and_take(pending: int) -> Result:
    """In a fresh interpreter: fill a JobQueue, then time take() at that depth."""
    from mpsched._core.job import JobRequest, Outcome
    from mpsched._core.queue import JobQueue

    queue = JobQueue()
    gc.collect()
    rss0 = rss_bytes(os.getpid())
    start = time.perf_counter()
    for i, payload in enumerate(_payloads(pending)):
        queue.submit(
            JobRequest(
                job_id=f"c0-{i}", client_id="c0", payload=payload, priority=2, delay=0.0, at=None
            )
        )
    fill = time.perf_counter() - start
    gc.collect()
    rss1 = rss_bytes(os.getpid())
    latencies = []
    spare = _payloads(TAKES)
    for i, payload in enumerate(spare):
        t0 = time.perf_counter_ns()
        assignment = queue.take("w1", 1.0)
        t1 = time.perf_counter_ns()
        assert assignment is not None
        queue.leases.complete(
            assignment.lease.lease_id,
            Outcome(
                job_id=assignment.lease.job_id, ok=True, payload=b"", traceback="", started=None
            ),
        )
        queue.submit(
            JobRequest(
                job_id=f"r-{i}", client_id="c0", payload=payload, priority=2, delay=0.0, at=None
            )
        )
        latencies.append((t1 - t0) / 1e3)
    latencies.sort()
    return {
        "submit_per_s": pending / fill,
        "bytes_per_job": (rss1 - rss0) / pending,
        "take_p50_us": statistics.median(latencies),
        "take_p99_us": latencies[int(0.99 * (len(latencies) - 1))],
    }


def sched_fill(pending: int) -> Result:
    """In a fresh interpreter: the same payloads as stdlib sched events."""
    runner = sched.scheduler(time.monotonic, time.sleep)
    gc.collect()
    rss0 = rss_bytes(os.getpid())
    now = time.monotonic()
    start = time.perf_counter()
    for payload in _payloads(pending):
        runner.enterabs(now + 3600, 2, noop, (payload,))
    fill = time.perf_counter() - start
    gc.collect()
    return {
        "submit_per_s": pending / fill,
        "bytes_per_job": (rss_bytes(os.getpid()) - rss0) / pending,
    }


# ----------------------------------------------------------------- processes


def run_mpsched(jobs: int) -> Result:
    with scheduler(workers=1) as s:
        s.submit(noop).result()
        manager = s._manager_process.pid
        time.sleep(0.2)
        rss0 = rss_bytes(manager)
        start = time.perf_counter()
        futures = [s.schedule(noop, delay=3600.0) for _ in range(jobs)]
        elapsed = time.perf_counter() - start
        rss1 = rss_bytes(manager)
        s.shutdown(wait=True, cancel_futures=True)
        del futures
    return {"submit_per_s": jobs / elapsed, "bytes_per_job": (rss1 - rss0) / jobs}


def apscheduler_fill(jobs: int) -> Result:
    """In a fresh interpreter: APScheduler 3 add_job of one-hour jobs (MemoryJobStore)."""
    from apscheduler.schedulers.background import BackgroundScheduler

    aps = BackgroundScheduler()
    aps.start()
    try:
        gc.collect()
        rss0 = rss_bytes(os.getpid())
        start = time.perf_counter()
        for i in range(jobs):
            aps.add_job(noop, "interval", hours=1, id=f"j{i}")
        elapsed = time.perf_counter() - start
        gc.collect()
        rss1 = rss_bytes(os.getpid())
    finally:
        aps.shutdown(wait=False)
    return {"submit_per_s": jobs / elapsed, "bytes_per_job": (rss1 - rss0) / jobs}


def bench(big: int, small: int, process_jobs: int, repeats: int) -> Section:
    section = Section(
        key="scale",
        title=f"6. Scale: {big:,} pending jobs",
        setup=(
            f"JobQueue rows: in-process, one fresh spawned interpreter per measurement, "
            f"{TAKES:,} timed `take()` calls at constant depth. mpsched/APScheduler rows: "
            f"{process_jobs:,} jobs due in 1 h, submitted through the manager (mpsched) "
            "or added in-process (APScheduler). Memory = RSS growth ÷ jobs."
        ),
    )
    contenders: list[tuple[str, Any]] = [
        (f"JobQueue, {big:,} pending", lambda: in_fresh_process(queue_fill_and_take, big)),
        (f"JobQueue, {small:,} pending", lambda: in_fresh_process(queue_fill_and_take, small)),
        (f"stdlib sched, {big:,} events", lambda: in_fresh_process(sched_fill, big)),
        ("mpsched submit (processes)", lambda: run_mpsched(process_jobs)),
        ("APScheduler 3 add_job", lambda: in_fresh_process(apscheduler_fill, process_jobs)),
    ]
    results = alternate(contenders, repeats, "scale")
    for name, runs in results.items():
        section.add(name, "submits/s", "jobs/s", column(runs, "submit_per_s"))
        section.add(name, "memory per pending job", "bytes", column(runs, "bytes_per_job"))
        if "take_p50_us" in runs[0]:
            section.add(name, "take() p50", "µs", column(runs, "take_p50_us"))
            section.add(name, "take() p99", "µs", column(runs, "take_p99_us"))
    growth = ratios(
        column(results[contenders[0][0]], "take_p50_us"),
        column(results[contenders[1][0]], "take_p50_us"),
    )
    section.add(contenders[0][0], f"take() p50 ÷ at {small:,}", "x", growth)
    section.targets.append(
        Target(
            f"take() flat from {small:,} to {big:,} pending (O(log n); this harness: ≤ 2x)",
            f"{summarise(growth)}x",
            median(growth) <= 2.0,
        )
    )
    return section
