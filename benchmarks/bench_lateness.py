"""2. Lateness: how long after its due instant a job starts, on an otherwise idle machine.

The plan: ``jobs`` jobs over ``span`` seconds at evenly spaced instants, ``pairs`` of which
carry two jobs (the issue's "500 jobs over 5 s, 100 instants carrying 2 jobs": 400
instants 12.5 ms apart, every fourth one a pair). A pair on two workers is the
signal()-trap case: the second job must start on the other worker, not after the first.

Every job is stamped where it runs (``time.monotonic()`` inside the job, in the worker);
the due instant is computed on the same machine-wide clock in this process. mpsched and
APScheduler get absolute instants (``at=`` epoch seconds / a ``run_date``) through one
wall-to-monotonic offset; stdlib ``sched`` takes the monotonic instant directly and runs
the jobs in this process (the floor: one thread, no IPC). mpsched's own JobQueue with two
taker threads in this process separates the queue's timed wait from the inter-process
hand-off (take's reply, the worker's unpickling).
"""

from __future__ import annotations

import contextlib
import sched
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
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
    ratios,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop, stamp
from benchmarks.watched import watching

WORKERS = 2


def plan(jobs: int, span: float, pairs: int) -> list[float]:
    """Offsets (seconds from the start) of every job: ``jobs - pairs`` instants."""
    instants = jobs - pairs
    step = span / instants
    doubled = {round(i * instants / pairs) for i in range(pairs)} if pairs else set()
    offsets: list[float] = []
    for k in range(instants):
        offsets.append(k * step)
        if k in doubled:
            offsets.append(k * step)
    return offsets


def _lead(jobs: int) -> float:
    """Time between the benchmark's start and the first due instant: room to submit."""
    return 0.5 + jobs * 0.002


Run = tuple[list[float], float]  # lateness of every job (s); other processes' cores


def run_mpsched(offsets: list[float], watched: bool = False) -> Run:
    """``watched``: its status page open and ``/metrics`` scraped once a second."""
    with scheduler(workers=WORKERS, http="127.0.0.1:0" if watched else None) as s:
        for f in [s.submit(noop) for _ in range(4 * WORKERS)]:
            f.result()
        with watching(s.http_url) if watched else contextlib.nullcontext(), OtherLoad() as other:
            wall = time.time() - time.monotonic()
            first = time.monotonic() + _lead(len(offsets))
            dues = [first + o for o in offsets]
            futures = [s.schedule(stamp, at=due + wall) for due in dues]
            _check_lead("mpsched", first)
            late = [f.result() - due for f, due in zip(futures, dues, strict=True)]
    return late, other.cores


def run_apscheduler(offsets: list[float]) -> Run:
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
    from apscheduler.executors.pool import ProcessPoolExecutor as ApsProcessPool
    from apscheduler.schedulers.background import BackgroundScheduler

    started: dict[str, float | None] = {}
    lock = threading.Lock()  # guards started; the executor's callback thread writes it
    every = threading.Event()  # set when all expected jobs reported
    expected = [0]

    def on_event(event: Any) -> None:
        with lock:
            ok = event.code == EVENT_JOB_EXECUTED
            started[event.job_id] = event.retval if ok else None
            if len(started) >= expected[0]:
                every.set()

    aps = BackgroundScheduler(
        executors={"default": ApsProcessPool(WORKERS)},
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 100},
    )
    aps.add_listener(on_event, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
    aps.start()
    try:
        expected[0] = 4 * WORKERS  # warm-up: start the pool's processes
        for i in range(expected[0]):
            aps.add_job(stamp, id=f"warm{i}")
        every.wait(60)
        with lock:
            started.clear()
            every.clear()
            expected[0] = len(offsets)
        with OtherLoad() as other:
            wall = time.time() - time.monotonic()
            first = time.monotonic() + _lead(len(offsets))
            dues = [first + o for o in offsets]
            for i, due in enumerate(dues):
                aps.add_job(
                    stamp,
                    "date",
                    id=f"j{i}",
                    run_date=datetime.fromtimestamp(due + wall, tz=timezone.utc),
                )
            _check_lead("APScheduler", first)
            every.wait(offsets[-1] + 60)
    finally:
        aps.shutdown(wait=True)
    return [_late(started.get(f"j{i}"), due) for i, due in enumerate(dues)], other.cores


def _late(start: float | None, due: float) -> float:
    return float("inf") if start is None else start - due


def run_sched(offsets: list[float]) -> Run:
    runner = sched.scheduler(time.monotonic, time.sleep)
    late: list[float] = []
    with OtherLoad() as other:
        first = time.monotonic() + _lead(len(offsets))
        for due in (first + o for o in offsets):
            runner.enterabs(due, 1, lambda due=due: late.append(stamp() - due))
        runner.run()
    return late, other.cores


def run_queue_threads(offsets: list[float]) -> Run:
    """mpsched's JobQueue with 2 taker threads in this process: the wait without the IPC."""
    from mpsched._core.job import JobRequest
    from mpsched._core.queue import JobQueue

    queue = JobQueue()
    dues: dict[str, float] = {}
    late: list[float] = []
    done = threading.Semaphore(0)

    def taker(worker_id: str) -> None:
        while (assignment := _take(queue, worker_id)) is not None:
            started = stamp()
            late.append(started - dues[assignment.lease.job_id])
            done.release()

    threads = [threading.Thread(target=taker, args=(f"t{i}",)) for i in range(WORKERS)]
    for t in threads:
        t.start()
    with OtherLoad() as other:
        wall = time.time() - time.monotonic()
        first = time.monotonic() + _lead(len(offsets))
        for i, offset in enumerate(offsets):
            dues[f"j{i}"] = first + offset
            queue.submit(
                JobRequest(
                    job_id=f"j{i}",
                    client_id="bench",
                    payload=b"",
                    priority=2,
                    delay=None,
                    at=first + offset + wall,
                )
            )
        for _ in offsets:
            done.acquire(timeout=60)
    queue.close()
    for t in threads:
        t.join(5)
    return late, other.cores


def _take(queue: Any, worker_id: str) -> Any:
    from mpsched._errors import SchedulerShutdownError

    while True:
        try:
            assignment = queue.take(worker_id, 5.0)
        except SchedulerShutdownError:
            return None
        if assignment is not None:
            return assignment


def _check_lead(name: str, first: float) -> None:
    if time.monotonic() > first:
        log(f"warning: {name} was still submitting when the first job fell due")


WATCHED = "mpsched, page open + /metrics scraped"
CONTENDERS: dict[str, Callable[[list[float]], Run]] = {
    "mpsched": run_mpsched,
    WATCHED: partial(run_mpsched, watched=True),
    "APScheduler 3 (process pool)": run_apscheduler,
    "stdlib sched (in-process)": run_sched,
    "mpsched JobQueue, 2 threads (no IPC)": run_queue_threads,
}


def bench(jobs: int, span: float, pairs: int, repeats: int) -> Section:
    """Run the lateness comparison; samples are kept (in ms) for the CDF chart."""
    offsets = plan(jobs, span, pairs)
    section = Section(
        key="lateness",
        title=(
            f"2. Lateness: {jobs} jobs over {span:g} s, {jobs - pairs} instants "
            f"({pairs} carrying 2 jobs), {WORKERS} workers"
        ),
        setup=(
            "Processes (sched: in-process). Lateness = the job's own `time.monotonic()` "
            "at its start minus its intended due instant on the same clock. "
            "APScheduler 3: BackgroundScheduler, MemoryJobStore, its ProcessPoolExecutor "
            f"({WORKERS} workers), misfire grace off. All jobs are submitted before the "
            f"first falls due. `{WATCHED}`: the same as `mpsched`, while another "
            "process asks its manager for `/api/dashboard` (what an open status page "
            "polls) and `/metrics` once a second each."
        ),
    )
    samples: dict[str, list[float]] = {name: [] for name in CONTENDERS}

    def contender(name: str) -> Result:
        late, other = CONTENDERS[name](offsets)
        samples[name].extend(x * 1e3 for x in late)
        result = {k: v * 1e3 for k, v in percentiles(late).items()}
        result["min"] = min(late) * 1e3  # negative: a job started before it was due
        result["missed"] = float(sum(1 for x in late if x == float("inf")))
        result["other_cores"] = other
        return result

    results = alternate(
        [(name, partial(contender, name)) for name in CONTENDERS], repeats, "lateness"
    )
    for name, runs in results.items():
        for q in ("min", "p50", "p90", "p99", "max"):
            section.add(name, f"lateness {q}", "ms", column(runs, q))
        section.add(
            name, "other processes' CPU during the run", "cores", column(runs, "other_cores")
        )
        if any(column(runs, "missed")):
            section.add(name, "jobs that never ran", "jobs", column(runs, "missed"))
    section.samples = samples
    _targets(section, results)
    return section


def _targets(section: Section, results: dict[str, list[Result]]) -> None:
    mine = results["mpsched"]
    aps = results["APScheduler 3 (process pool)"]
    floor = results["stdlib sched (in-process)"]
    watched = results[WATCHED]
    for q in ("p50", "p99"):
        section.add(
            WATCHED,
            f"{q} minus mpsched unwatched {q}",
            "ms",
            [a - b for a, b in zip(column(watched, q), column(mine, q), strict=True)],
        )
    p99 = ratios(column(mine, "p99"), column(aps, "p99"))
    section.add("mpsched", "p99 ÷ APScheduler p99", "x", p99)
    section.targets.append(
        Target("lateness p99 ≤ 0.5x APScheduler's", f"{summarise(p99)}x", median(p99) <= 0.5)
    )
    gap = [a - b for a, b in zip(column(mine, "p50"), column(floor, "p50"), strict=True)]
    section.add("mpsched", "p50 minus sched p50", "ms", gap)
    section.targets.append(
        Target("lateness p50 within 0.3 ms of sched's", f"{summarise(gap)} ms", median(gap) <= 0.3)
    )
