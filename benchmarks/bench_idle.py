"""4. Idle cost: 8 workers waiting for a job due in an hour.

Measured as user+system CPU seconds over the window, of the manager and worker processes
(the target) and separately of the client process (its result thread long-polls). Peers:
a warmed ProcessPoolExecutor(8) with nothing to do, and APScheduler 3 holding the same
one-hour job with a warmed 8-process executor (its scheduler thread's CPU counted from
its /proc schedstat).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from functools import partial
from multiprocessing import get_context
from typing import Any

import psutil

from benchmarks._common import (
    Result,
    Section,
    Target,
    alternate,
    column,
    median,
    mpsched_processes,
    pool_processes,
    precise_cpu_seconds,
    scheduler,
    summarise,
    thread_cpu_seconds,
)
from benchmarks.jobs import noop

WORKERS = 8
SETTLE = 0.5  # seconds between setting up and opening the window


def run_mpsched(window: float) -> Result:
    with scheduler(workers=WORKERS) as s:
        wait_futures([s.submit(noop) for _ in range(4 * WORKERS)])
        future = s.schedule(noop, delay=3600.0)
        roles = mpsched_processes(s)
        time.sleep(SETTLE)
        served = roles["manager"] + roles["workers"]
        client = roles["client"]
        before, client0 = precise_cpu_seconds(served), precise_cpu_seconds(client)
        time.sleep(window)
        used = precise_cpu_seconds(served) - before
        client_used = precise_cpu_seconds(client) - client0
        future.cancel()
    return _per_10s(used, client_used, window)


def run_process_pool(window: float) -> Result:
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=get_context("fork")) as pool:
        wait_futures([pool.submit(noop) for _ in range(4 * WORKERS)])
        time.sleep(SETTLE)
        helpers, me = pool_processes(), [psutil.Process()]
        before, client0 = precise_cpu_seconds(helpers), precise_cpu_seconds(me)
        time.sleep(window)
        return _per_10s(
            precise_cpu_seconds(helpers) - before, precise_cpu_seconds(me) - client0, window
        )


def run_apscheduler(window: float) -> Result:
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
    from apscheduler.executors.pool import ProcessPoolExecutor as ApsProcessPool
    from apscheduler.schedulers.background import BackgroundScheduler

    aps = BackgroundScheduler(
        executors={"default": ApsProcessPool(WORKERS)}, job_defaults={"misfire_grace_time": None}
    )
    aps.start()
    try:
        done = threading.Semaphore(0)
        aps.add_listener(lambda _event: done.release(), EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
        for i in range(4 * WORKERS):
            aps.add_job(noop, id=f"warm{i}")
        for _ in range(4 * WORKERS):
            done.acquire(timeout=60)
        aps.add_job(noop, "interval", hours=1, id="hourly")
        time.sleep(SETTLE)
        thread = _native_id(aps)
        helpers = pool_processes()
        before, loop0 = precise_cpu_seconds(helpers), _thread_cpu(thread)
        time.sleep(window)
        used = precise_cpu_seconds(helpers) - before + _thread_cpu(thread) - loop0
    finally:
        aps.shutdown(wait=True)
    return _per_10s(used, 0.0, window)


def _native_id(aps: Any) -> int | None:
    thread = getattr(aps, "_thread", None)
    return getattr(thread, "native_id", None)


def _thread_cpu(native_id: int | None) -> float:
    return 0.0 if native_id is None else thread_cpu_seconds(os.getpid(), native_id)


def _per_10s(used: float, client: float, window: float) -> Result:
    return {"cpu_s_per_10s": used * 10 / window, "client_cpu_s_per_10s": client * 10 / window}


CONTENDERS = {
    "mpsched": run_mpsched,
    "ProcessPoolExecutor": run_process_pool,
    "APScheduler 3 (process pool)": run_apscheduler,
}


def bench(window: float, repeats: int) -> Section:
    """Measure CPU burnt while waiting; normalised to a 10 s window."""
    section = Section(
        key="idle",
        title=f"4. Idle cost: {WORKERS} workers, one job due in 1 h",
        setup=(
            f"Processes. A {window:g} s window after {SETTLE} s of settling; CPU seconds "
            "scaled to 10 s. mpsched: manager + worker pids; ProcessPoolExecutor: its "
            "processes; APScheduler: its scheduler thread + its executor's processes. "
            "Client: the submitting process (mpsched's result thread long-polls every "
            "5 s), reported apart."
        ),
    )
    results = alternate([(n, partial(fn, window)) for n, fn in CONTENDERS.items()], repeats, "idle")
    for name, runs in results.items():
        section.add(
            name, "CPU per 10 s idle (manager + workers / pool)", "s", column(runs, "cpu_s_per_10s")
        )
        if name != "APScheduler 3 (process pool)":
            section.add(
                name, "CPU per 10 s idle, client process", "s", column(runs, "client_cpu_s_per_10s")
            )
    cost = column(results["mpsched"], "cpu_s_per_10s")
    section.targets.append(
        Target(
            "idle: manager + 8 workers < 0.05 s CPU per 10 s",
            f"{summarise(cost)} s",
            median(cost) < 0.05,
        )
    )
    return section
