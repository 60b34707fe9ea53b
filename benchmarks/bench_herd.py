"""5. Thundering herd: many idle takers, a burst of jobs due within one second.

Two levels:

* processes: mpsched with 32 workers runs 2,000 jobs due within 1 s; measured are the
  manager's CPU per job (ns-resolution schedstat) and condition wake-ups per dispatched job
  (``stats().queue.wakeups``), plus the jobs' lateness.
* JobQueue with 32 taker threads, in this process: the real queue (leader/follower, one
  ``notify()`` per event) against the same queue whose condition turns every ``notify()``
  into ``notify_all()`` (Java's signalAll), built through the injectable clock, both
  in the same run. Wake-ups per job and CPU per job (``time.process_time``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks._common import (
    Result,
    Section,
    Target,
    alternate,
    column,
    median,
    percentiles,
    precise_cpu_seconds,
    ratios,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop, stamp
from mpsched._core.clock import SystemClock
from mpsched._core.job import JobRequest, Outcome
from mpsched._core.queue import JobQueue
from mpsched._errors import SchedulerShutdownError

TAKE_TIMEOUT = 5.0  # as the manager's long poll: takers rarely time out in the window


class _SignalAllCondition:
    """A condition whose ``notify()`` wakes every waiter, like Java's signalAll()."""

    def __init__(self, lock: threading.Lock) -> None:
        self._condition = threading.Condition(lock)

    def wait(self, timeout: float | None = None) -> bool:
        return self._condition.wait(timeout)

    def notify(self, n: int = 1) -> None:
        self._condition.notify_all()

    def notify_all(self) -> None:
        self._condition.notify_all()


class SignalAllClock(SystemClock):
    """The system clock, handing JobQueue signal-all conditions."""

    def condition(self, lock: threading.Lock) -> Any:
        return _SignalAllCondition(lock)


# ----------------------------------------------------------------- processes


def run_mpsched(workers: int, jobs: int, span: float) -> Result:
    import psutil

    with scheduler(workers=workers) as s:
        for f in [s.submit(noop) for _ in range(2 * workers)]:
            f.result()
        manager = [psutil.Process(s._manager_process.pid)]
        time.sleep(0.3)
        wakeups0, cpu0 = s.stats().queue.wakeups, precise_cpu_seconds(manager)
        wall = time.time() - time.monotonic()
        first = time.monotonic() + 0.5 + jobs * 0.001
        dues = [first + span * i / jobs for i in range(jobs)]
        futures = [s.schedule(stamp, at=due + wall) for due in dues]
        submit_cpu = precise_cpu_seconds(manager) - cpu0
        late = [f.result() - due for f, due in zip(futures, dues, strict=True)]
        cpu = precise_cpu_seconds(manager) - cpu0
        wakeups = s.stats().queue.wakeups - wakeups0
    return {
        "wakeups_per_job": wakeups / jobs,
        "manager_cpu_us_per_job": cpu / jobs * 1e6,
        "manager_submit_cpu_us_per_job": submit_cpu / jobs * 1e6,
        "manager_dispatch_cpu_us_per_job": (cpu - submit_cpu) / jobs * 1e6,
        **{f"late_{k}_ms": v * 1e3 for k, v in percentiles(late).items()},
    }


# ----------------------------------------------------------- JobQueue, threads


def run_queue(clock: SystemClock, takers: int, jobs: int, span: float) -> Result:
    queue = JobQueue(clock=clock)
    done = threading.Semaphore(0)
    threads = [
        threading.Thread(target=_taker, args=(queue, f"t{i}", done), daemon=True)
        for i in range(takers)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)  # every taker is waiting
    wakeups0, cpu0 = queue.stats().wakeups, time.process_time()
    lead = 0.2
    for i in range(jobs):
        queue.submit(
            JobRequest(
                job_id=f"j{i}",
                client_id="bench",
                payload=b"x",
                priority=2,
                delay=lead + span * i / jobs,
                at=None,
            )
        )
    for _ in range(jobs):
        done.acquire(timeout=30)
    cpu = time.process_time() - cpu0
    stats = queue.stats()
    queue.close()
    for t in threads:
        t.join(5)
    return {
        "wakeups_per_job": (stats.wakeups - wakeups0) / jobs,
        "cpu_us_per_job": cpu / jobs * 1e6,
        "late_p99_ms": stats.lateness["p99"] * 1e3,
    }


def _taker(queue: JobQueue, worker_id: str, done: threading.Semaphore) -> None:
    while True:
        try:
            assignment = queue.take(worker_id, TAKE_TIMEOUT)
        except SchedulerShutdownError:
            return
        if assignment is None:
            continue
        started = time.monotonic()
        queue.leases.complete(
            assignment.lease.lease_id,
            Outcome(
                job_id=assignment.lease.job_id, ok=True, payload=b"", traceback="", started=started
            ),
        )
        done.release()


def bench(workers: int, jobs: int, span: float, repeats: int) -> Section:
    """Both levels; the JobQueue variants alternate inside each repeat."""
    section = Section(
        key="herd",
        title=f"5. Thundering herd: {workers} takers, {jobs:,} jobs due within {span:g} s",
        setup=(
            "mpsched: processes, jobs submitted in due order before the first falls due "
            "(`at=`); manager CPU by ns-resolution schedstat; wake-ups = returns from a "
            "condition wait in the manager. JobQueue rows: threads in this process, no "
            "IPC, the same queue code with `notify()` turned into `notify_all()` for the "
            "signal-all variant."
        ),
    )
    results = alternate(
        [
            ("mpsched (processes)", lambda: run_mpsched(workers, jobs, span)),
            ("JobQueue leader/follower", lambda: run_queue(SystemClock(), workers, jobs, span)),
            ("JobQueue signal-all", lambda: run_queue(SignalAllClock(), workers, jobs, span)),
        ],
        repeats,
        "herd",
    )
    mine = results["mpsched (processes)"]
    section.add("mpsched (processes)", "wake-ups per job", "", column(mine, "wakeups_per_job"))
    section.add(
        "mpsched (processes)", "manager CPU per job", "µs", column(mine, "manager_cpu_us_per_job")
    )
    section.add(
        "mpsched (processes)",
        "… of which submit phase",
        "µs",
        column(mine, "manager_submit_cpu_us_per_job"),
    )
    section.add(
        "mpsched (processes)",
        "… of which dispatch phase",
        "µs",
        column(mine, "manager_dispatch_cpu_us_per_job"),
    )
    for q in ("p50", "p99", "max"):
        section.add("mpsched (processes)", f"lateness {q}", "ms", column(mine, f"late_{q}_ms"))
    for name in ("JobQueue leader/follower", "JobQueue signal-all"):
        section.add(name, "wake-ups per job", "", column(results[name], "wakeups_per_job"))
        section.add(
            name, "CPU per job (all threads)", "µs", column(results[name], "cpu_us_per_job")
        )
        section.add(name, "lateness p99", "ms", column(results[name], "late_p99_ms"))
    fewer = ratios(
        column(results["JobQueue signal-all"], "wakeups_per_job"),
        column(results["JobQueue leader/follower"], "wakeups_per_job"),
    )
    section.add("JobQueue leader/follower", "signal-all ÷ leader/follower wake-ups", "x", fewer)
    per_job = column(mine, "wakeups_per_job")
    section.targets.append(
        Target(
            "herd: O(1) wake-ups per job with 32 workers"
            " (this harness: ≤ 3; no number in the issue)",
            f"{summarise(per_job)} per job; signal-all wakes {summarise(fewer)}x more",
            median(per_job) <= 3,
        )
    )
    return section
