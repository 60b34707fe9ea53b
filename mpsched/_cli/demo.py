"""The demo of ``python -m mpsched demo``: 4 producer processes, 3 workers, 12 jobs in
three waves, due 1, 2 and 3 s from the start at HIGH, MEDIUM or LOW priority.

What ``examples/three_waves.py`` (and ``make demo``) runs; its docstring tells the story.
The producers run in spawned processes, so ``produce`` and ``run_job`` live here at module
level, importable by the producer and worker processes. Output goes to the stream given to
:func:`run_demo`; the library itself never prints.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, TextIO

from mpsched._client.client import connect
from mpsched._client.scheduler import Scheduler
from mpsched._core.job import Priority

WORKERS = 3
PRODUCERS = 4
WAVES = 3  # j = 0, 1, 2, due at +1 s, +2 s, +3 s
WORK_SECONDS = 0.1  # long enough that the 4th job of a wave must wait for a free worker
WAVE_PRIORITIES = (Priority.HIGH, Priority.MEDIUM, Priority.LOW)  # by producer % 3
EARLY_TOLERANCE = 1e-3  # our and the manager's wall-to-monotonic offsets may differ by µs


class JobRun(NamedTuple):
    """What a job returns: who ran it and when it started."""

    job_id: int
    priority: str
    worker_pid: int
    started: float  # the worker's time.monotonic() as the job began


@dataclass(frozen=True)
class WaveReport:
    """What a producer process sends back once its jobs are done."""

    producer: int
    pid: int
    submitted_by: float  # time.monotonic() once all its jobs were submitted
    runs: tuple[JobRun, ...]


def run_job(job_id: int, priority: str, work_seconds: float) -> JobRun:
    """A job: note who and when, then do a little work."""
    started = time.monotonic()
    time.sleep(work_seconds)
    return JobRun(job_id=job_id, priority=priority, worker_pid=os.getpid(), started=started)


def produce(producer: int, address: Any, authkey: bytes, parent: Connection) -> None:
    """A producer process: submit jobs ``producer*10 + j`` into the shared scheduler."""
    priority = WAVE_PRIORITIES[producer % len(WAVE_PRIORITIES)]
    with connect(address, authkey=authkey) as client:
        parent.send(os.getpid())  # connected: ready for the origin
        origin_epoch: float = parent.recv()
        futures = [
            client.schedule(
                run_job,
                producer * 10 + j,
                priority.name,
                WORK_SECONDS,
                at=origin_epoch + (j + 1),
                priority=priority,
            )
            for j in range(WAVES)
        ]
        submitted_by = time.monotonic()
        runs = tuple(f.result(timeout=30) for f in futures)
    parent.send(
        WaveReport(producer=producer, pid=os.getpid(), submitted_by=submitted_by, runs=runs)
    )


def run_producers(s: Scheduler) -> tuple[float, list[WaveReport]]:
    """Run the producer processes; return the origin (wave j is due at origin + j s) and
    their reports.

    Spawning a process and importing mpsched takes a good part of a second, so the origin
    is taken once every producer has connected, not before they start.
    """
    ctx = multiprocessing.get_context("spawn")
    links = [ctx.Pipe() for _ in range(PRODUCERS)]
    producers = [
        # daemon: should this process fail, its producers must not keep it from exiting
        ctx.Process(
            target=produce, args=(p, s.address, s.authkey, child), name=f"producer-{p}", daemon=True
        )
        for p, (_, child) in enumerate(links)
    ]
    for process, (_, child) in zip(producers, links, strict=True):
        process.start()
        child.close()  # so a producer that dies shows here as EOFError, not a hang
    for parent, _ in links:
        receive(parent)
    origin = time.monotonic()
    origin_epoch = origin + (time.time() - time.monotonic())
    for parent, _ in links:
        parent.send(origin_epoch)
    reports: list[WaveReport] = [receive(parent) for parent, _ in links]
    for process in producers:
        process.join(10)
    return origin, reports


def receive(link: Connection, timeout: float = 30.0) -> Any:
    """The next message from a producer; raises TimeoutError rather than waiting forever."""
    if not link.poll(timeout):
        raise TimeoutError(f"no message from a producer within {timeout} s")
    return link.recv()


def warm_up(s: Scheduler) -> float:
    """Run one job on each worker, so that wave 1 finds them as warm as waves 2 and 3.

    A fresh worker imports a job's module (this one) when it unpickles its first job; that
    takes 10-20 ms, which wave 1 would otherwise start late by. Returns the time it took.
    """
    begun = time.monotonic()
    warmed: set[int] = set()
    for _ in range(5):  # each job holds its worker 100 ms: one round nearly always does it
        futures = [s.submit(run_job, -1, "warm-up", WORK_SECONDS) for _ in range(WORKERS)]
        warmed |= {f.result(timeout=30).worker_pid for f in futures}
        if len(warmed) == WORKERS:
            break
    return time.monotonic() - begun


def handout_key(run: JobRun) -> tuple[int, int, float]:
    """The heap's order within the demo: due (the wave), priority level, then, for equal
    priorities, the start (the submission order of concurrent producers is not known here)."""
    return (wave_of(run), Priority[run.priority].level, run.started)


def wave_of(run: JobRun) -> int:
    return run.job_id % 10 + 1


def print_runs(runs: list[JobRun], origin: float, out: TextIO) -> list[list[JobRun]]:
    """Print every job in hand-out order with its start; return the waves in that order."""
    waves: list[list[JobRun]] = [[] for _ in range(WAVES)]
    print("jobs in the order the manager handed them out (due time, then priority):", file=out)
    for run in sorted(runs, key=handout_key):
        wave = wave_of(run)
        late_ms = (run.started - (origin + wave)) * 1000
        note = "  (waited for a free worker)" if late_ms > WORK_SECONDS * 500 else ""
        if waves[wave - 1] == [] and wave > 1:
            print(file=out)
        waves[wave - 1].append(run)
        print(
            f"wave {wave}  job {run.job_id:2d}  {run.priority:<6}  worker {run.worker_pid}"
            f"  started {late_ms:+7.1f} ms after due{note}",
            file=out,
        )
    return waves


def check(waves: list[list[JobRun]], origin: float) -> tuple[list[str], list[str]]:
    """What went wrong: (out of hand-out order, not on time), each a list of phrases.

    Hand-out order holds when the first WORKERS jobs of a wave in heap order all started
    before any of the others: those found a free worker, the others waited for one.
    """
    disorder, late = [], []
    for number, wave in enumerate(waves, start=1):
        due = origin + number
        early = [r.job_id for r in wave if r.started < due - EARLY_TOLERANCE]
        stray = [r.job_id for r in wave if r.started > due + 0.5]
        if early or stray:
            late.append(f"wave {number}: early {early}, more than 0.5 s late {stray}")
        first, rest = wave[:WORKERS], wave[WORKERS:]
        if len(wave) != PRODUCERS or max(r.started for r in first) >= min(r.started for r in rest):
            by_start = sorted(wave, key=lambda r: r.started)
            disorder.append(
                f"wave {number}: started {[r.priority for r in by_start]}, "
                f"handed out {[r.priority for r in wave]}"
            )
    return disorder, late


def run_demo(out: TextIO) -> int:
    """Run the demo, printing to ``out``.

    Returns:
        0 when every wave was handed out in heap order and started on time, else 1 (the
        ✗ lines say why).
    """
    print(
        f"demo: one manager with {WORKERS} worker processes; {PRODUCERS} producer "
        f"processes each submit {WAVES} jobs, due 1, 2 and 3 s from now, at HIGH, MEDIUM "
        f"or LOW priority (by producer): {PRODUCERS * WAVES} jobs in {WAVES} waves. Each "
        f"wave should start by priority, on time.",
        file=out,
    )
    begun = time.monotonic()
    with Scheduler(workers=WORKERS) as s:
        worker_pids = sorted(w.pid for w in s.stats().workers)
        ready = time.monotonic() - begun
        warm = warm_up(s)
        print(
            f"scheduler: {WORKERS} worker processes {worker_pids}, ready in {ready:.2f} s; "
            f"warmed up with a job each in {warm:.2f} s",
            file=out,
        )
        origin, reports = run_producers(s)  # wave j+1 is due at origin + j + 1 s
        lateness = s.stats().lateness
    pids = [r.pid for r in reports]
    last_submit = max(r.submitted_by for r in reports) - origin
    print(
        f"{PRODUCERS} producer processes {pids} submitted {len(pids) * WAVES} jobs "
        f"by {last_submit * 1000:+.0f} ms; waves due at +1 s, +2 s, +3 s\n",
        file=out,
    )
    waves = print_runs([run for r in reports for run in r.runs], origin, out)
    print_summary(waves, origin, lateness, out)
    disorder, late = check(waves, origin)
    for problem in disorder + late:
        print(f"✗ {problem}", file=out)
    if not disorder:
        print(
            "✓ every wave was handed out in heap order: HIGH, HIGH, MEDIUM at once, LOW "
            "once a worker was free",
            file=out,
        )
    if not late:
        print("✓ every wave started on time: none early, none more than 0.5 s late", file=out)
    return 1 if disorder or late else 0


def print_summary(
    waves: list[list[JobRun]], origin: float, lateness: dict[str, float], out: TextIO
) -> None:
    """Jobs, workers used, the lateness of jobs that found a free worker, the manager's."""
    on_time = [
        (r.started - origin - n) * 1000
        for n, wave in enumerate(waves, start=1)
        for r in wave[:WORKERS]
    ]
    print(
        f"\nsummary: {sum(map(len, waves))} jobs in {WAVES} waves on "
        f"{len({r.worker_pid for w in waves for r in w})} workers",
        file=out,
    )
    print(
        f"  jobs that found a free worker started {statistics.median(on_time):.1f} ms "
        f"(median), {max(on_time):.1f} ms (max) after due",
        file=out,
    )
    print(
        f"  the manager's lateness over all jobs: p50 {lateness['p50'] * 1000:.1f} ms, "
        f"max {lateness['max'] * 1000:.1f} ms",
        file=out,
    )
