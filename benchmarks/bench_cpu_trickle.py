"""Section 11's trickle: jobs of 1 ms due one by one at a steady rate, 2 workers.

Every job is submitted before the first falls due, each with its own instant (mpsched
``schedule(at=...)``, APScheduler 3's date trigger): no batching can help, so the CPU the
client and the manager spend per job is the cost of each job's wake-ups and messages.
The job (``burn``) stamps ``time.time()`` at its start and returns the CPU it used itself.
The run is split in two phases: submitting (until the last submit is acknowledged) and
the jobs falling due (until the last result is in).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait as wait_futures
from datetime import datetime, timezone
from functools import partial
from typing import Any

import psutil

from benchmarks._common import (
    OtherLoad,
    Result,
    Section,
    Target,
    alternate,
    column,
    log,
    median,
    mpsched_processes,
    percentiles,
    pool_processes,
    scheduler,
    summarise,
)
from benchmarks._threads import ProcessMeter
from benchmarks.jobs import burn, calibrate_burn, noop

WORKERS = 2
JOB_SECONDS = 0.001
CPU_GOAL_US = 30.0  # manager + client CPU per job while the jobs fall due
# "Lateness p99 unchanged" is judged against the base commit's p99 measured with this
# harness on a quiet machine: the median of `run.py --only cpu` repeats on 751f38f, to be
# set here from the run on the machine that judges (None: not judged). This trickle's p99
# moved from 3 ms to 300 ms between runs with 0.1-0.8 cores taken by other tenants, so
# it is judged only when other processes used at most QUIET_CORES (median of repeats).
P99_BASE_MS: float | None = None
P99_ALLOWANCE = 1.25  # x the base
QUIET_CORES = 0.1
MPSCHED = "mpsched"
APSCHEDULER = "APScheduler 3 (process pool)"

Outcome = tuple[float, float]  # a burn's start (wall clock) and its own CPU seconds
Phases = dict[str, dict[str, float]]  # phase -> role -> CPU seconds


def lead(jobs: int) -> float:
    """Seconds from the start of submitting to the first due instant: room to submit."""
    return 1.0 + jobs * 100e-6


def _result(
    ats: list[float],
    outcomes: list[Outcome | None],
    phases: Phases,
    late_submit: bool,
    other: float,
) -> Result:
    """Lateness percentiles (ms) and CPU per job (µs) by phase and role."""
    jobs = len(ats)
    late = [float("inf") if o is None else o[0] - at for o, at in zip(outcomes, ats, strict=True)]
    job_cpu = sum(o[1] for o in outcomes if o is not None)
    result = {f"late_{k}": v * 1e3 for k, v in percentiles(late).items()}
    result.update(
        job_cpu_ms=job_cpu / jobs * 1e3,
        late_submit=float(late_submit),
        missed=float(sum(1 for o in outcomes if o is None)),
        other_cores=other,
    )
    for phase, used in phases.items():
        for role, seconds in used.items():
            if role == "workers":
                seconds -= job_cpu if phase != "submit" else 0.0
            result[f"{phase}_us_{role}"] = seconds / jobs * 1e6
    for phase in ("all", "due"):
        result[f"{phase}_us_together"] = sum(
            result.get(f"{phase}_us_{r}", 0.0) for r in ("client", "manager", "scheduler")
        )
    return result


def _phases(submit: dict[str, float], due: dict[str, float]) -> Phases:
    return {
        "submit": submit,
        "due": due,
        "all": {role: submit[role] + due[role] for role in submit},
    }


def run_mpsched(jobs: int, rate: int, loops: int) -> Result:
    with scheduler(workers=WORKERS) as s:
        wait_futures([s.submit(noop) for _ in range(20)])
        wait_futures([s.submit(burn, 1_000) for _ in range(WORKERS)])
        meters = {role: ProcessMeter(procs) for role, procs in mpsched_processes(s).items()}
        with OtherLoad() as other:
            first = time.time() + lead(jobs)
            ats = [first + i / rate for i in range(jobs)]
            futures = [s.schedule(burn, loops, at=at) for at in ats]
            s.stats()  # flushes the client's write-behind outbox: every submit is in
            late_submit = time.time() > first
            submit = {role: meter.read() for role, meter in meters.items()}
            wait_futures(futures, timeout=jobs / rate + 120)
            due = {role: meter.read() for role, meter in meters.items()}
        outcomes = [f.result(timeout=0) if f.done() else None for f in futures]
    return _result(ats, outcomes, _phases(submit, due), late_submit, other.cores)


def run_apscheduler(jobs: int, rate: int, loops: int) -> Result:
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
    from apscheduler.executors.pool import ProcessPoolExecutor as ApsProcessPool
    from apscheduler.schedulers.background import BackgroundScheduler

    outcomes: dict[str, Outcome | None] = {}
    lock = threading.Lock()  # guards outcomes and expected; APScheduler's callbacks write
    every = threading.Event()  # set once every expected job has reported; the run waits
    expected = [0]

    def on_event(event: Any) -> None:
        with lock:
            ok = event.code == EVENT_JOB_EXECUTED
            outcomes[event.job_id] = event.retval if ok else None
            if len(outcomes) >= expected[0]:
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
            aps.add_job(burn, args=(1_000,), id=f"warm{i}")
        every.wait(60)
        with lock:
            outcomes.clear()
            every.clear()
            expected[0] = jobs
        roles = {"scheduler": [psutil.Process()], "workers": pool_processes()}
        meters = {role: ProcessMeter(procs) for role, procs in roles.items()}
        with OtherLoad() as other:
            first = time.time() + lead(jobs)
            ats = [first + i / rate for i in range(jobs)]
            for i, at in enumerate(ats):
                aps.add_job(
                    burn,
                    "date",
                    args=(loops,),
                    id=f"j{i}",
                    run_date=datetime.fromtimestamp(at, tz=timezone.utc),
                )
            late_submit = time.time() > first
            submit = {role: meter.read() for role, meter in meters.items()}
            every.wait(jobs / rate + 120)
            due = {role: meter.read() for role, meter in meters.items()}
    finally:
        aps.shutdown(wait=True)
    return _result(
        ats,
        [outcomes.get(f"j{i}") for i in range(jobs)],
        _phases(submit, due),
        late_submit,
        other.cores,
    )


CONTENDERS = {MPSCHED: run_mpsched, APSCHEDULER: run_apscheduler}
ROLES = (
    ("client", "client"),
    ("manager", "manager"),
    ("scheduler", "scheduler process"),
    ("together", "client + manager"),
    ("workers", "workers, beyond the jobs' own"),
)


def add_rows(section: Section, rate: int, span: float, repeats: int) -> int:
    """Run the trickle for every contender and add its rows and targets; returns N."""
    jobs = round(rate * span)
    loops = calibrate_burn(JOB_SECONDS)
    results = alternate(
        [(name, partial(fn, jobs, rate, loops)) for name, fn in CONTENDERS.items()],
        repeats,
        "cpu trickle",
    )
    for name, runs in results.items():
        for q in ("p50", "p99", "max"):
            section.add(name, f"trickle: lateness {q}", "ms", column(runs, f"late_{q}"))
        section.add(name, "trickle: jobs' own CPU per job", "ms", column(runs, "job_cpu_ms"))
        for phase, when in (("all", "whole run"), ("due", "due phase"), ("submit", "submit phase")):
            for key, role in ROLES:
                if key == "together" and name != MPSCHED:
                    continue
                if f"{phase}_us_{key}" in runs[0]:
                    section.add(
                        name,
                        f"trickle: CPU per job, {role} ({when})",
                        "µs",
                        column(runs, f"{phase}_us_{key}"),
                    )
        section.add(
            name,
            "trickle: other processes' CPU during the run",
            "cores",
            column(runs, "other_cores"),
        )
        for key, what in (
            ("missed", "jobs that never ran"),
            ("late_submit", "runs still submitting at the first due instant"),
        ):
            if any(column(runs, key)):
                section.add(name, f"trickle: {what}", "", column(runs, key))
                log(f"warning: trickle, {name}: {what} in some repeats")
    _targets(section, results[MPSCHED], jobs, span)
    return jobs


def _targets(section: Section, runs: list[Result], jobs: int, span: float) -> None:
    cpu = column(runs, "due_us_together")
    whole = column(runs, "all_us_together")
    section.targets.append(
        Target(
            f"trickle ({jobs:,} jobs of 1 ms over {span:g} s): client + manager CPU ≤ "
            f"{CPU_GOAL_US:g} µs per job while they fall due",
            f"{summarise(cpu)} µs (whole run, submits included: {summarise(whole)} µs)",
            median(cpu) <= CPU_GOAL_US,
        )
    )
    p99, other = column(runs, "late_p99"), median(column(runs, "other_cores"))
    measured = f"{summarise(p99)} ms; other processes' CPU {other:.2f} cores (median)"
    if P99_BASE_MS is None:
        goal, met = "no base measured yet: see P99_BASE_MS in bench_cpu_trickle.py", None
    else:
        goal = f"≤ {P99_ALLOWANCE:g}x 751f38f's {P99_BASE_MS:g} ms"
        met = median(p99) <= P99_ALLOWANCE * P99_BASE_MS if other <= QUIET_CORES else None
        if met is None:
            measured += f": not judged above {QUIET_CORES} cores"
    section.targets.append(Target(f"trickle: lateness p99 unchanged ({goal})", measured, met))
