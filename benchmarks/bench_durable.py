"""7. Durable store: what journaling every job in SQLite costs, and how fast a manager recovers.

Three parts, each alternating its contenders inside every repeat:

* dispatch: N no-op jobs due now on 2 workers, ``submit()`` per job then waiting for every
  result (as section 1), with no store (memory), ``durability="sync"`` and
  ``durability="process"``; jobs/s and the ratio to no store, per repeat.
* submit into a store: M jobs due in an hour (``schedule(noop, delay=3600)``), timed until
  every submit is acknowledged (``stats()`` flushes the client's write-behind outbox and
  shows them pending). Peer: APScheduler 3 adding date-trigger jobs to its
  SQLAlchemyJobStore on SQLite (one transaction per ``add_job``), in a fresh interpreter.
* recovery: a store holding R pending no-op jobs (written once with ``SQLiteStore`` and
  ``StoredJob`` records, then copied for each run) is opened by a new ``Scheduler``; seconds
  from the call until it returns and until ``stats()`` shows all R pending, and the
  manager's RSS against a Scheduler on an empty store started in the same repeat.

Store files go to a temporary directory; its file system is named in the table, since
``durability="sync"`` costs one fsync per commit, and an fdatasync of the lease log every
2 ms while jobs start, there.

APScheduler's part alone, at any size (run.py times it over fewer jobs: it adds a few hundred
a second): ``python -m benchmarks.bench_durable --apscheduler 100000``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import wait as wait_futures
from datetime import datetime, timedelta, timezone
from functools import partial
from itertools import count
from typing import Any

import psutil

from benchmarks._common import (
    OtherLoad,
    Result,
    Section,
    Target,
    _busy_seconds,
    alternate,
    column,
    cpu_seconds,
    in_fresh_process,
    log,
    median,
    mpsched_processes,
    pool_processes,
    ratios,
    rss_bytes,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop

WARM = 200  # jobs each dispatch run completes before the clock starts
SETTLE = 0.5  # seconds between recovery and reading the manager's RSS
DEADLINE = 300.0  # seconds a run may wait for its jobs to show as pending
PREFILL_BATCH = 10_000  # StoredJob records per SQLiteStore.submit call when writing the template

NO_STORE = "mpsched, no store (memory)"
SYNC = "mpsched, SQLite durability=sync"
PROCESS = "mpsched, SQLite durability=process"
APSCHEDULER = "APScheduler 3, SQLAlchemyJobStore (SQLite)"
RECOVERED = "mpsched, SQLite, {n} pending"
EMPTY = "mpsched, SQLite, empty store"

_names = count(1)


def _store_path(directory: str, what: str) -> str:
    """A new file name in ``directory``: one manager per store file, a fresh one per run."""
    return os.path.join(directory, f"{what}-{next(_names)}.db")


def _remove_store(path: str) -> None:
    """The database and its WAL, shared-memory and lock files, to keep the disk light."""
    for suffix in ("", "-wal", "-shm", "-journal", ".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def _files_bytes(path: str) -> int:
    """Bytes of the database and its WAL (what a store takes on disk right now)."""
    return sum(
        os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix)
    )


def _options(directory: str, durability: str | None, what: str) -> dict[str, Any]:
    if durability is None:
        return {}
    return {"store": _store_path(directory, what), "durability": durability}


def _pending(s: Any) -> int:
    return sum(s.stats().pending.values())


def _wait_pending(s: Any, jobs: int) -> None:
    """Until ``stats()`` counts ``jobs`` pending (it flushes this client's outbox first)."""
    deadline = time.monotonic() + DEADLINE
    while (seen := _pending(s)) < jobs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{seen:,} of {jobs:,} jobs pending after {DEADLINE:.0f} s")
        time.sleep(0.001)


# ------------------------------------------------------------------------- dispatch


def run_dispatch(directory: str, durability: str | None, jobs: int, workers: int) -> Result:
    """``submit(noop)`` per job, then wait for every result; as section 1's mpsched row."""
    options = _options(directory, durability, f"dispatch-{durability}")
    try:
        with scheduler(workers=workers, **options) as s:
            wait_futures([s.submit(noop) for _ in range(WARM)])
            roles = mpsched_processes(s)
            before = {role: cpu_seconds(procs) for role, procs in roles.items()}
            with OtherLoad() as other:
                start = time.perf_counter()
                futures = [s.submit(noop) for _ in range(jobs)]
                submitted = time.perf_counter()
                wait_futures(futures)
                end = time.perf_counter()
            used = {role: cpu_seconds(procs) - before[role] for role, procs in roles.items()}
            failed = sum(1 for f in futures if f.exception() is not None)
    finally:
        if options:
            _remove_store(options["store"])
    if failed:
        raise RuntimeError(f"{failed:,} of {jobs:,} no-op jobs failed")
    return {
        "jobs_per_s": jobs / (end - start),
        "submit_per_s": jobs / (submitted - start),
        "cpu_us_manager": used["manager"] / jobs * 1e6,
        "cpu_us_per_job": sum(used.values()) / jobs * 1e6,
        "other_cores": other.cores,
    }


# ----------------------------------------------------------------- submit into a store


def run_submit(directory: str, durability: str, jobs: int, workers: int) -> Result:
    """``schedule(noop, delay=3600)`` per job until ``stats()`` shows every one pending."""
    options = _options(directory, durability, f"submit-{durability}")
    path = options["store"]
    try:
        with scheduler(workers=workers, **options) as s:
            s.submit(noop).result()
            with OtherLoad() as other:
                start = time.perf_counter()
                futures = [s.schedule(noop, delay=3600.0) for _ in range(jobs)]
                called = time.perf_counter()
                _wait_pending(s, jobs)
                end = time.perf_counter()
            size = _files_bytes(path)
            del futures
    finally:
        _remove_store(path)
    return {
        "jobs_per_s": jobs / (end - start),
        "calls_per_s": jobs / (called - start),
        "disk_per_job": size / jobs,
        "other_cores": other.cores,
    }


def apscheduler_submit(path: str, jobs: int) -> Result:
    """In a fresh interpreter: APScheduler 3, started, adding one-hour date-trigger jobs.

    Each ``add_job`` of a running BackgroundScheduler writes its job to the store in its
    own transaction (SQLite's defaults: rollback journal, synchronous=FULL) before it
    returns, so the loop ending is every job durable.
    """
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    aps = BackgroundScheduler(jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{path}")})
    aps.start()
    try:
        when = datetime.now(timezone.utc) + timedelta(hours=1)
        with OtherLoad() as other:
            start = time.perf_counter()
            for i in range(jobs):
                aps.add_job(noop, "date", run_date=when, id=f"job-{i}")
            end = time.perf_counter()
    finally:
        aps.shutdown(wait=False)
    return {
        "jobs_per_s": jobs / (end - start),
        "calls_per_s": jobs / (end - start),
        "disk_per_job": _files_bytes(path) / jobs,
        "other_cores": other.cores,
    }


def run_apscheduler(directory: str, jobs: int) -> Result:
    path = _store_path(directory, "apscheduler")
    try:
        return in_fresh_process(apscheduler_submit, path, jobs)
    finally:
        _remove_store(path)


# ----------------------------------------------------------------------- recovery


def write_template(path: str, jobs: int) -> float:
    """A store holding ``jobs`` pending no-op jobs due in a day; returns the seconds taken.

    Written as a client's submits would leave them: one client id, ids ``CLIENT-n``, the
    payload mpsched's client makes for ``noop()``, seq in submission order. Closed, so the
    WAL is checkpointed into the one file that each run copies.
    """
    from mpsched._payload.pickling import pickle_job
    from mpsched._store.base import StoredJob
    from mpsched._store.sqlite import SQLiteStore

    payload = pickle_job(noop, (), {})
    client = uuid.uuid4().hex[:12]
    name = f"{noop.__module__}.{noop.__qualname__}"
    now = time.time()
    start = time.perf_counter()
    with SQLiteStore(path, durability="process") as store:
        for first in range(0, jobs, PREFILL_BATCH):
            store.submit(
                [
                    StoredJob(
                        f"{client}-{i + 1}",
                        client,
                        None,
                        name,
                        payload,
                        2,
                        now + 86400.0 + i * 1e-3,
                        i,
                        None,
                        0,
                        0,
                        now,
                    )
                    for i in range(first, min(jobs, first + PREFILL_BATCH))
                ]
            )
    with contextlib.suppress(FileNotFoundError):
        os.remove(path + ".lock")  # left by a closed store; a copy must not carry it
    return time.perf_counter() - start


def run_recover(directory: str, template: str | None, jobs: int, workers: int) -> Result:
    """A Scheduler on a copy of ``template`` (None: an empty store); timed from the call."""
    path = _store_path(directory, "recover")
    try:
        if template is not None:
            shutil.copyfile(template, path)
        with OtherLoadWithNewProcesses() as other:
            start = time.perf_counter()
            with scheduler(workers=workers, store=path) as s:
                returned = time.perf_counter()
                _wait_pending(s, jobs)
                ready = time.perf_counter()
                other.stop()
                time.sleep(SETTLE)
                rss = rss_bytes(s._manager_process.pid)
                seen = _pending(s)
    finally:
        _remove_store(path)
    if seen != jobs:
        raise RuntimeError(f"{seen:,} jobs pending, {jobs:,} expected")
    return {
        "returned_s": returned - start,
        "ready_s": ready - start,
        "rss": float(rss),
        "other_cores": other.cores,
    }


class OtherLoadWithNewProcesses:
    """Like ``_common.OtherLoad``, for a window in which this benchmark starts processes.

    A Scheduler's manager and workers start inside the recovery window: their whole CPU
    time is this benchmark's, so it is counted from zero, while processes that existed
    before (this one, the forkserver) count from their value at the start. ``stop`` ends
    the window while those processes still run.
    """

    def __enter__(self) -> OtherLoadWithNewProcesses:
        self.cores = math.nan
        self._before = {
            proc.pid: cpu_seconds([proc]) for proc in [psutil.Process(), *pool_processes()]
        }
        self._start = (time.perf_counter(), _busy_seconds())
        return self

    def stop(self) -> None:
        wall0, busy0 = self._start
        busy, wall = _busy_seconds() - busy0, time.perf_counter() - wall0
        ours = 0.0
        for proc in [psutil.Process(), *pool_processes()]:
            ours += cpu_seconds([proc]) - self._before.get(proc.pid, 0.0)
        self.cores = max(0.0, (busy - ours) / wall) if wall > 0 else math.nan

    def __exit__(self, *exc: object) -> None:
        if math.isnan(self.cores):
            self.stop()


# ---------------------------------------------------------------------------- bench


def bench(
    dispatch_jobs: int,
    submit_jobs: int,
    apscheduler_jobs: int,
    recover_jobs: int,
    repeats: int,
    workers: int = 2,
) -> Section:
    """Run the three parts and summarise them in one section."""
    with tempfile.TemporaryDirectory(prefix="mpsched-durable-") as directory:
        section = Section(
            key="durable",
            title=(
                f"7. Durable store: dispatch, submit into a store, recovery of "
                f"{recover_jobs:,} jobs"
            ),
            setup=_setup(
                directory, dispatch_jobs, submit_jobs, apscheduler_jobs, recover_jobs, workers
            ),
        )
        _dispatch(section, directory, dispatch_jobs, repeats, workers)
        _submit(section, directory, submit_jobs, apscheduler_jobs, repeats, workers)
        _recovery(section, directory, recover_jobs, repeats, workers)
    return section


def _dispatch(section: Section, directory: str, jobs: int, repeats: int, workers: int) -> None:
    contenders = [
        (name, partial(run_dispatch, directory, durability, jobs, workers))
        for name, durability in ((NO_STORE, None), (SYNC, "sync"), (PROCESS, "process"))
    ]
    results = alternate(contenders, repeats, "durable dispatch")
    memory = column(results[NO_STORE], "jobs_per_s")
    for name, runs in results.items():
        section.add(
            name,
            f"dispatch {jobs:,}: jobs/s (submit → last result)",
            "jobs/s",
            column(runs, "jobs_per_s"),
        )
        section.add(
            name, f"dispatch {jobs:,}: submit calls/s", "calls/s", column(runs, "submit_per_s")
        )
        section.add(
            name, f"dispatch {jobs:,}: CPU per job, manager", "µs", column(runs, "cpu_us_manager")
        )
        section.add(
            name,
            f"dispatch {jobs:,}: CPU per job, all processes",
            "µs",
            column(runs, "cpu_us_per_job"),
        )
        section.add(
            name,
            f"dispatch {jobs:,}: other processes' CPU during the run",
            "cores",
            column(runs, "other_cores"),
        )
    for name, goal in ((SYNC, 0.7), (PROCESS, 0.85)):
        rel = ratios(column(results[name], "jobs_per_s"), memory)
        section.add(name, "dispatch: throughput ÷ no store", "x", rel)
        durability = name.rsplit("=", 1)[1]
        section.targets.append(
            Target(
                f"durable dispatch, durability={durability}, ≥ {goal}x no store",
                f"{summarise(rel)}x",
                median(rel) >= goal,
            )
        )


def _submit(
    section: Section, directory: str, jobs: int, apscheduler_jobs: int, repeats: int, workers: int
) -> None:
    contenders: list[tuple[str, Callable[[], Result]]] = [
        (SYNC, partial(run_submit, directory, "sync", jobs, workers)),
        (PROCESS, partial(run_submit, directory, "process", jobs, workers)),
        (APSCHEDULER, partial(run_apscheduler, directory, apscheduler_jobs)),
    ]
    results = alternate(contenders, repeats, "durable submit")
    for name, runs in results.items():
        n = apscheduler_jobs if name == APSCHEDULER else jobs
        section.add(
            name,
            f"submit {n:,} due in 1 h: jobs/s until all acknowledged",
            "jobs/s",
            column(runs, "jobs_per_s"),
        )
        if name != APSCHEDULER:
            section.add(
                name, f"submit {n:,}: schedule() calls/s", "calls/s", column(runs, "calls_per_s")
            )
        section.add(
            name,
            f"submit {n:,}: database + WAL on disk per job",
            "bytes",
            column(runs, "disk_per_job"),
        )
        section.add(
            name,
            f"submit {n:,}: other processes' CPU during the run",
            "cores",
            column(runs, "other_cores"),
        )
    aps = column(results[APSCHEDULER], "jobs_per_s")
    for name in (SYNC, PROCESS):
        rates = column(results[name], "jobs_per_s")
        section.add(name, "submit: jobs/s ÷ APScheduler's", "x", ratios(rates, aps))
        durability = name.rsplit("=", 1)[1]
        section.targets.append(
            Target(
                f"submit into a SQLite store, durability={durability}, ≥ 20,000 jobs/s",
                f"{summarise(rates)} jobs/s",
                median(rates) >= 20_000,
            )
        )


def _recovery(section: Section, directory: str, jobs: int, repeats: int, workers: int) -> None:
    template = os.path.join(directory, "template.db")
    log(f"durable recovery: writing {jobs:,} pending jobs to {template}")
    seconds = write_template(template, jobs)
    size = _files_bytes(template)
    log(f"durable recovery: template written in {seconds:.1f} s, {size / 2**20:.0f} MiB")
    full = RECOVERED.format(n=f"{jobs:,}")
    contenders: list[tuple[str, Callable[[], Result]]] = [
        (full, partial(run_recover, directory, template, jobs, workers)),
        (EMPTY, partial(run_recover, directory, None, 0, workers)),
    ]
    results = alternate(contenders, repeats, "durable recovery")
    for name, runs in results.items():
        section.add(name, "start: Scheduler() returns", "s", column(runs, "returned_s"))
        section.add(
            name, "start: until stats() shows every job pending", "s", column(runs, "ready_s")
        )
        section.add(
            name, "manager RSS after start", "MiB", [v / 2**20 for v in column(runs, "rss")]
        )
        section.add(
            name, "start: other processes' CPU meanwhile", "cores", column(runs, "other_cores")
        )
    ready = column(results[full], "ready_s")
    grown = [
        a - b
        for a, b in zip(column(results[full], "rss"), column(results[EMPTY], "rss"), strict=True)
    ]
    section.add(
        full,
        "manager memory per pending job (RSS minus the empty store's)",
        "bytes",
        [g / jobs for g in grown],
    )
    section.targets.append(
        Target(
            f"recover {jobs:,} pending jobs ≤ 10 s (Scheduler() until stats() shows them)",
            f"{summarise(ready)} s",
            median(ready) <= 10.0,
        )
    )
    section.notes.append(
        f"The recovered store: {jobs:,} pending no-op jobs ({size / jobs:.0f} bytes each on "
        f"disk, {size / 2**20:.0f} MiB), written once with `SQLiteStore.submit` in "
        f"{PREFILL_BATCH:,}-job calls ({jobs / seconds:,.0f} jobs/s, durability=process) "
        "and copied before each run."
    )


def _setup(
    directory: str,
    dispatch_jobs: int,
    submit_jobs: int,
    apscheduler_jobs: int,
    recover_jobs: int,
    workers: int,
) -> str:
    import sqlite3

    aps_count = (
        "the same count"
        if apscheduler_jobs == submit_jobs
        else f"{apscheduler_jobs:,} jobs (it adds a few hundred a second: the Method "
        f"section above has one run of 100,000)"
    )
    return (
        f"Processes, {workers} workers, store files in a temporary directory on "
        f"{_filesystem(directory)}; SQLite {sqlite3.sqlite_version} in WAL mode, "
        "durability=sync commits with an fsync and fdatasync()s the lease log at most "
        "every 2 ms (group sync, off the jobs' path), durability=process does neither. "
        f"**Dispatch**: as section 1's mpsched row ({WARM} warm-up jobs, then {dispatch_jobs:,} "
        "`submit(noop)` calls and waiting for every result), one fresh Scheduler and store "
        "per run. **Submit into a store**: "
        f"{submit_jobs:,} `schedule(noop, delay=3600)` calls, timed until `stats()` (which "
        "flushes the client's write-behind outbox) shows all of them pending; a submit is "
        "acknowledged only once its commit is done. APScheduler 3: BackgroundScheduler "
        f"started, SQLAlchemyJobStore on SQLite (SQLAlchemy {_version('sqlalchemy')}), "
        f"`add_job(noop, 'date', run_date=now + 1 h)` for {aps_count}, in a fresh "
        "interpreter; each call commits its job before it returns. **Recovery**: a new "
        f"`Scheduler(workers={workers}, store=copy)` on a store holding {recover_jobs:,} "
        "pending no-op jobs, timed from the call; the empty-store row is the same start "
        "with nothing to recover, in the same repeat. Memory per job: the manager's RSS "
        f"{SETTLE} s after every job showed as pending, minus the empty-store manager's, "
        f"÷ {recover_jobs:,}."
    )


def _filesystem(path: str) -> str:
    """The type and device of the file system holding ``path``."""
    real = os.path.realpath(path)
    mounts = [
        p
        for p in psutil.disk_partitions(all=True)
        if os.path.commonpath([real, p.mountpoint]) == p.mountpoint
    ]
    if not mounts:
        return "an unknown file system"
    mount = max(mounts, key=lambda p: len(p.mountpoint))
    return f"{mount.fstype} ({mount.device} at {mount.mountpoint})"


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def main(argv: list[str] | None = None) -> None:
    """APScheduler's part alone, at any size: its rate over 100,000 jobs takes minutes."""
    parser = argparse.ArgumentParser(
        description="APScheduler 3 adding date-trigger jobs to a SQLAlchemyJobStore on SQLite"
    )
    parser.add_argument("--apscheduler", type=int, default=100_000, metavar="JOBS")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mpsched-durable-") as directory:
        start = time.perf_counter()
        result = run_apscheduler(directory, args.apscheduler)
        elapsed = time.perf_counter() - start
    print(
        f"APScheduler 3 add_job, {args.apscheduler:,} date-trigger jobs into "
        f"SQLAlchemyJobStore (SQLite): {result['jobs_per_s']:,.0f} jobs/s, "
        f"{result['disk_per_job']:.0f} bytes on disk per job, other processes' CPU "
        f"{result['other_cores']:.2f} cores ({elapsed:.0f} s)"
    )


if __name__ == "__main__":
    main()
