"""9. Recurring: drift of a fixed-rate schedule, 1,000 runs 10 ms apart.

A fixed-rate schedule plans run k at ``start + k * interval``. Two things can go wrong: each
run starts late (the offset's spread), and the lateness adds up from run to run (a trend:
the timeline is re-anchored on when the previous run happened instead of when it was
planned). Offset of run k = its start, stamped by the job itself with ``time.monotonic()``
(CLOCK_MONOTONIC, shared by every process on Linux), minus ``start + k * interval`` mapped
to the monotonic clock with one wall-to-monotonic offset taken in this process.

Contenders, alternating inside each repeat:

* mpsched: ``s.every(0.010, stamp_run, path, start=<epoch ~0.5 s ahead>)`` on 2 workers.
  The job appends its start and its run id (``"{id}@{slot, UTC}"``) to a file; the run id
  names the slot k, so a late run is never mistaken for the next slot's. Slots without a
  run are counted from the file and explained by ``Schedule.counters`` (skipped: the
  previous run was still pending or running; missed: a backlog).
* mpsched with ``overlap="allow", catchup="all"``: the next run is armed when the previous
  one is handed to a worker (not when it ended), and a late run makes no slot skipped:
  every slot runs, as in Java's fixed rate. Not the default; it shows what re-arming
  after the end costs.
* mpsched, the same 1,000 instants as one-off jobs (``schedule(at=...)``, all queued before
  the first is due): the control. Its runs take the same path through the heap and the
  workers but nothing is re-armed, so the difference to the every() rows is what planning
  the next run as the schedule goes costs.
* APScheduler 3: ``IntervalTrigger(seconds=0.01)`` from the same kind of start, ending
  after the 1,000th slot, in a BackgroundScheduler with its thread pool executor and with
  its process pool executor (2 workers each). ``misfire_grace_time=None``,
  ``coalesce=False`` and ``max_instances`` large, so that a late run is run (not dropped as
  a misfire, merged with the next, or skipped for overlapping); the event's
  ``scheduled_run_time`` names the slot.
* stdlib ``sched``, Java's ``scheduleAtFixedRate`` by hand: each run enters the next at
  ``start + (k + 1) * interval`` (absolute), in this process, running the job inline.
"""

from __future__ import annotations

import contextlib
import math
import os
import sched
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

from benchmarks._common import (
    OtherLoad,
    Result,
    Section,
    Target,
    alternate,
    column,
    log,
    median,
    percentiles,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop, stamp, stamp_run

WORKERS = 2
INTERVAL = 0.010
LEAD = 0.5  # seconds from the call to the first slot
P99_TARGET_MS = 0.5

# Offsets of every run of one contender's run, by slot (seconds; None: no run for the
# slot), and the facts the contender reports besides (counters, other processes' CPU).
Run = tuple[list[float | None], dict[str, float]]


def wall_offset() -> float:
    """``time.time() - time.monotonic()``, from the tightest of a few paired readings."""
    best = (math.inf, 0.0)
    for _ in range(20):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        best = min(best, (after - before, wall - (before + after) / 2))
    return best[1]


def _start_epoch(lead: float = LEAD) -> float:
    """A fixed epoch ``lead`` ahead, whole milliseconds (its slots are exact microseconds)."""
    return math.ceil((time.time() + lead) * 1000) / 1000


def _slot(label: float, start: float, runs: int) -> int | None:
    k = round((label - start) / INTERVAL)
    return k if 0 <= k < runs and abs(start + k * INTERVAL - label) < 1e-4 else None


def _run_label(job_id: str) -> float | None:
    """The slot of a run id ``"{schedule}@2026-12-03T08:56:59.408000Z"`` (epoch seconds)."""
    _, sep, when = job_id.rpartition("@")
    if not sep:
        return None
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()


def _wait_for_file(path: str, last_label: float, until: float) -> None:
    """Until the run for ``last_label`` wrote its line (or ``until``, monotonic)."""
    while time.monotonic() < until:
        with contextlib.suppress(OSError), open(path) as f:
            for line in f.read().splitlines()[-4:]:
                label = _run_label(line.partition(" ")[2])
                if label is not None and label >= last_label - 1e-6:
                    return
        time.sleep(0.02)


def _read_runs(path: str, start: float, first: float, runs: int) -> list[float | None]:
    offsets: list[float | None] = [None] * runs
    with open(path) as f:
        for line in f:
            stamped, _, job_id = line.strip().partition(" ")
            label = _run_label(job_id)
            k = None if label is None else _slot(label, start, runs)
            if k is not None:
                offsets[k] = float(stamped) - (first + k * INTERVAL)
    return offsets


def _warm(s: Any) -> None:
    for f in [s.submit(noop) for _ in range(4 * WORKERS)]:
        f.result()


def run_mpsched(runs: int, repeat: int, **options: str) -> Run:
    with (
        tempfile.TemporaryDirectory(prefix="mpsched-drift-") as tmp,
        scheduler(workers=WORKERS) as s,
    ):
        path = os.path.join(tmp, "runs")
        _warm(s)
        with OtherLoad() as other:
            offset = wall_offset()
            start = _start_epoch()
            first = start - offset
            schedule = s.every(
                INTERVAL, stamp_run, path, start=start, id=f"drift{repeat}", **options
            )
            last = start + (runs - 1) * INTERVAL
            time.sleep(max(0.0, first + runs * INTERVAL - time.monotonic()))
            _wait_for_file(path, last, time.monotonic() + 2.0)
            counters = schedule.counters
            schedule.cancel()
        offsets = _read_runs(path, start, first, runs)
    return offsets, {
        "other_cores": other.cores,
        "skipped": counters.skipped,
        "missed": counters.missed,
        "failed": counters.failed,
    }


def run_mpsched_oneoff(runs: int, repeat: int) -> Run:
    """The control: the same instants as one-off jobs, all queued before the first."""
    with (
        tempfile.TemporaryDirectory(prefix="mpsched-drift-") as tmp,
        scheduler(workers=WORKERS) as s,
    ):
        path = os.path.join(tmp, "runs")
        _warm(s)
        with OtherLoad() as other:
            offset = wall_offset()
            start = _start_epoch(LEAD + runs * 0.002)  # room to queue them all
            first = start - offset
            futures = [s.schedule(stamp_run, path, at=start + k * INTERVAL) for k in range(runs)]
            s.stats()  # flushes the client's write-behind outbox: all are in the heap
            if time.monotonic() > first:
                log("warning: mpsched was still submitting when the first job fell due")
            for f in futures:
                f.result()
        slot_of = {f.job_id: k for k, f in enumerate(futures)}
        offsets: list[float | None] = [None] * runs
        with open(path) as f:
            for line in f:
                stamped, _, job_id = line.strip().partition(" ")
                k = slot_of[job_id]
                offsets[k] = float(stamped) - (first + k * INTERVAL)
    return offsets, {"other_cores": other.cores}


def run_apscheduler(executor: str, runs: int, repeat: int) -> Run:
    from apscheduler.events import (
        EVENT_JOB_ERROR,
        EVENT_JOB_EXECUTED,
        EVENT_JOB_MAX_INSTANCES,
        EVENT_JOB_MISSED,
    )
    from apscheduler.executors.pool import ProcessPoolExecutor as ApsProcessPool
    from apscheduler.executors.pool import ThreadPoolExecutor as ApsThreadPool
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    events: list[tuple[int, datetime | None, float | None]] = []
    lock = threading.Lock()  # guards events; APScheduler's executor callbacks append
    enough = threading.Event()  # set once `wanted` events came in; the benchmark waits
    wanted = [4 * WORKERS]

    def on_event(event: Any) -> None:
        with lock:
            when = getattr(event, "scheduled_run_time", None)
            value = getattr(event, "retval", None)
            events.append((event.code, when, value))
            if len(events) >= wanted[0]:
                enough.set()

    pool = ApsProcessPool(WORKERS) if executor == "process" else ApsThreadPool(WORKERS)
    aps = BackgroundScheduler(
        executors={"default": pool},
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": runs},
    )
    aps.add_listener(
        on_event, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES
    )
    aps.start()
    try:
        for i in range(wanted[0]):  # warm-up: start the pool's processes or threads
            aps.add_job(noop, id=f"warm{i}")
        enough.wait(60)
        with lock:
            events.clear()
            enough.clear()
            wanted[0] = runs
        with OtherLoad() as other:
            offset = wall_offset()
            start = _start_epoch()
            first = start - offset
            begin = datetime.fromtimestamp(start, timezone.utc)
            trigger = IntervalTrigger(
                seconds=INTERVAL,
                start_date=begin,
                end_date=begin + timedelta(seconds=(runs - 0.5) * INTERVAL),
                timezone="UTC",
            )
            aps.add_job(stamp, trigger, id="drift")
            enough.wait(LEAD + runs * INTERVAL + 30)
    finally:
        aps.shutdown(wait=True)
    offsets: list[float | None] = [None] * runs
    dropped = 0
    for code, when, value in events:
        if code != EVENT_JOB_EXECUTED or when is None or value is None:
            dropped += 1
            continue
        k = _slot(when.timestamp(), start, runs)
        if k is not None:
            offsets[k] = value - (first + k * INTERVAL)
    return offsets, {"other_cores": other.cores, "dropped": float(dropped)}


def run_sched(runs: int, repeat: int) -> Run:
    """Java's scheduleAtFixedRate with stdlib sched: each run enters the next, absolute."""
    runner = sched.scheduler(time.monotonic, time.sleep)
    offsets: list[float | None] = [None] * runs
    with OtherLoad() as other:
        first = time.monotonic() + LEAD

        def fire(k: int) -> None:
            offsets[k] = stamp() - (first + k * INTERVAL)
            if k + 1 < runs:
                runner.enterabs(first + (k + 1) * INTERVAL, 1, fire, (k + 1,))

        runner.enterabs(first, 1, fire, (0,))
        runner.run()
    return offsets, {"other_cores": other.cores}


MPSCHED = "mpsched every()"
CONTENDERS: dict[str, Callable[[int, int], Run]] = {
    MPSCHED: run_mpsched,
    'mpsched every(overlap="allow", catchup="all")': partial(
        run_mpsched, overlap="allow", catchup="all"
    ),
    "mpsched, the same instants as one-off jobs (control)": run_mpsched_oneoff,
    "APScheduler 3, thread pool": partial(run_apscheduler, "thread"),
    "APScheduler 3, process pool": partial(run_apscheduler, "process"),
    "stdlib sched, fixed rate (in-process)": run_sched,
}


def summarise_run(offsets: list[float | None]) -> Result:
    """p50/p99/max/last offset (ms), the trend, and how many slots ran."""
    ran = [x for x in offsets if x is not None]
    q = percentiles(ran)
    result = {
        "p50": q["p50"] * 1e3,
        "p99": q["p99"] * 1e3,
        "max": q["max"] * 1e3,
        "min": min(ran, default=math.nan) * 1e3,
    }
    last = next((x for x in reversed(offsets) if x is not None), math.nan)
    result["last"] = last * 1e3
    result["trend"] = float(last * 1e3 > result["p99"])  # 1: the last run later than p99
    result["slope"] = _slope(offsets) * 1e3 * 1000  # ms per 1,000 runs
    result["ran"] = float(len(ran))
    return result


def _slope(offsets: list[float | None]) -> float:
    """Least-squares slope of offset against k (seconds per run)."""
    points = [(k, x) for k, x in enumerate(offsets) if x is not None]
    if len(points) < 2:
        return math.nan
    mk = sum(k for k, _ in points) / len(points)
    mx = sum(x for _, x in points) / len(points)
    den = sum((k - mk) ** 2 for k, _ in points)
    return sum((k - mk) * (x - mx) for k, x in points) / den


def bench(runs: int, repeats: int) -> Section:
    """Run the drift comparison: ``runs`` slots 10 ms apart per contender and repeat."""
    section = Section(
        key="recurring",
        title=(
            f"9. Recurring: drift of a fixed-rate schedule, {runs:,} runs every "
            f"{INTERVAL * 1e3:g} ms, {WORKERS} workers"
        ),
        setup=(
            "Processes (APScheduler's thread pool and sched: in-process). Offset of run "
            "k = the job's own `time.monotonic()` at its start minus start + k x "
            "interval on the same clock; the start is a fixed epoch ~0.5 s ahead. "
            "Trend: the last run's offset above that run's p99 (a count of repeats), "
            "and the least-squares slope of offset against k. APScheduler 3: "
            "BackgroundScheduler, IntervalTrigger, misfire grace off, coalesce off, "
            f'max_instances {runs:,}. "Slots run" counts distinct slots < {runs:,} '
            "with a run."
        ),
    )
    counter = iter(range(10**6))

    def contender(name: str) -> Result:
        offsets, facts = CONTENDERS[name](runs, next(counter))
        return {**summarise_run(offsets), **facts}

    results = alternate(
        [(name, partial(contender, name)) for name in CONTENDERS], repeats, "recurring"
    )
    for name, rows in results.items():
        for q in ("p50", "p99", "max"):
            section.add(name, f"offset {q}", "ms", column(rows, q))
        section.add(name, "offset of the last run", "ms", column(rows, "last"))
        section.add(name, "slope of offset against k", "ms per 1,000 runs", column(rows, "slope"))
        section.add(
            name,
            "repeats whose last run is later than its p99",
            f"of {len(rows)}",
            [sum(column(rows, "trend"))],
            digits=1,
        )
        section.add(name, f"slots run, of {runs:,}", "", column(rows, "ran"))
        for key, what in (
            ("skipped", "slots skipped (counters.skipped)"),
            ("missed", "slots missed (counters.missed)"),
            ("dropped", "runs dropped (misfire, max instances, error)"),
        ):
            if key in rows[0]:
                section.add(name, what, "", column(rows, key), digits=1)
        section.add(
            name, "other processes' CPU during the run", "cores", column(rows, "other_cores")
        )
    mine = results[MPSCHED]
    p99 = column(mine, "p99")
    floor = column(results["stdlib sched, fixed rate (in-process)"], "p99")
    section.targets.append(
        Target(
            f"recurring: every(10 ms) offset p99 ≤ {P99_TARGET_MS} ms",
            f"{summarise(p99)} ms over the runs that happened (slots skipped: "
            f"{summarise(column(mine, 'skipped'))}); in-process sched, same repeats: "
            f"{summarise(floor)} ms",
            median(p99) <= P99_TARGET_MS,
        )
    )
    trend = sum(column(mine, "trend"))
    slots = column(mine, "ran")
    section.targets.append(
        Target(
            "recurring: no trend (last run no later than p99, every repeat)",
            f"last run later than p99 in {trend:g} of {len(mine)} repeats; slope "
            f"{summarise(column(mine, 'slope'))} ms per 1,000 runs; slots run "
            f"{summarise(slots)}",
            trend == 0,
        )
    )
    return section
