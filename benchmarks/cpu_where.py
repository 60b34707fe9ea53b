"""Where mpsched's CPU goes, thread by thread: section 11's trickle and 2 ms batch, one run each.

    python benchmarks/cpu_where.py [--rate 1000] [--seconds 5] [--jobs 2000] [--job-ms 2]

For each process of a ``Scheduler(workers=2)`` (the client, the manager, each worker) and
each of its threads: CPU per job (``/proc/PID/task/TID/schedstat``, ns) and voluntary and
involuntary context switches per job (``/proc/PID/task/TID/status``), sorted by CPU within
each process. The client's threads are named from ``threading.enumerate()``; the others'
from ``py-spy dump`` (``pip install py-spy``), with the function each thread was started
on; without py-spy they are shown by tid. Each process's total from its CPU clock keeps the
time of threads that exited during the window, which the per-thread rows lose.

- **trickle**: ``--rate`` jobs a second due evenly over ``--seconds``, 1 ms of CPU each,
  all scheduled (``at=``) before the first falls due; the window is the due phase, from the
  acknowledgement of the last submit to the last result.
- **batch**: ``--jobs`` jobs of ``--job-ms`` submitted at once; the window runs from the
  first submit to the last result.

A profiling aid, not a comparison: section 11 of ``run.py`` has the figures to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p
)

from benchmarks._common import measured_package_root, percentiles, scheduler  # noqa: E402
from benchmarks._threads import (  # noqa: E402
    ThreadCounts,
    difference,
    process_cpu_seconds,
    thread_counts,
)
from benchmarks.bench_cpu_trickle import lead  # noqa: E402
from benchmarks.jobs import burn, calibrate_burn, noop  # noqa: E402

WORKERS = 2
Outcome = tuple[float, float]  # a burn's start (wall clock) and its own CPU seconds


@dataclass(frozen=True)
class Window:
    """What one measured stretch of a run did: per process, per thread, and in all."""

    threads: dict[int, dict[int, ThreadCounts]]  # pid -> tid -> counts over the window
    totals: dict[int, float]  # pid -> CPU seconds by its process CPU clock


class Probe:
    """Per-thread and per-process counters of a set of pids, read at each :meth:`mark`."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids
        self._last = self._read()

    def _read(self) -> tuple[dict[int, dict[int, ThreadCounts]], dict[int, float]]:
        return (
            {pid: thread_counts(pid) for pid in self._pids},
            {pid: process_cpu_seconds(pid) or 0.0 for pid in self._pids},
        )

    def mark(self) -> Window:
        """What happened since the previous mark (or since the probe was made)."""
        threads0, totals0 = self._last
        threads1, totals1 = self._last = self._read()
        return Window(
            {pid: difference(threads0[pid], threads1[pid]) for pid in self._pids},
            {pid: totals1[pid] - totals0[pid] for pid in self._pids},
        )


def thread_names(pid: int) -> dict[int, str]:
    """tid -> a name for each thread of ``pid``.

    The client's: its Python name. Another process's, from ``py-spy dump`` taken after
    the run: its Python name (a manager thread serving a connection is named after the
    peer's process and thread), with the function it was started on where that says more.
    """
    if pid == os.getpid():
        return {t.native_id: t.name for t in threading.enumerate() if t.native_id}
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        done = subprocess.run(
            [spy, "dump", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        dumped: list[dict[str, Any]] = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    return {
        t["os_thread_id"]: t["thread_name"] + _started_on(t["frames"])
        for t in dumped
        if t.get("os_thread_id")
    }


def _started_on(frames: list[dict[str, Any]]) -> str:
    """`` [function]``: the outermost frame of a py-spy stack (innermost first) below
    threading's and multiprocessing's own; empty for the manager's connection threads."""
    for frame in reversed(frames):
        name = str(frame["name"])
        if not name.startswith(("Thread.", "<module>", "BaseProcess.", "_main", "_serve_one")):
            return "" if name == "HardenedServer._serve_proven" else f" [{name}]"
    return ""


@dataclass(frozen=True)
class Measured:
    """A scenario's window, the jobs' own CPU in it, a summary line, the submit phase."""

    window: Window
    own_cpu: float  # seconds, all jobs together
    summary: str
    submit: Window | None = None


def run_trickle(s: Any, probe: Probe, jobs: int, rate: int, loops: int) -> Measured:
    """Schedule ``jobs`` at ``rate`` a second; the window is the due phase alone."""
    first = time.time() + lead(jobs)
    ats = [first + i / rate for i in range(jobs)]
    futures: list[Future[Outcome]] = [s.schedule(burn, loops, at=at) for at in ats]
    s.stats()  # flushes the client's write-behind outbox: every submit is in
    if time.time() > first:
        print("warning: still submitting when the first job fell due", file=sys.stderr)
    submit = probe.mark()
    wait_futures(futures, timeout=jobs / rate + 120)
    window = probe.mark()
    outcomes = [f.result(timeout=0) for f in futures]
    late = percentiles([start - at for (start, _), at in zip(outcomes, ats, strict=True)])
    return Measured(
        window,
        sum(cpu for _, cpu in outcomes),
        f"lateness p50 {late['p50'] * 1e3:.3f} ms, p99 {late['p99'] * 1e3:.3f} ms, "
        f"max {late['max'] * 1e3:.3f} ms",
        submit,
    )


def run_batch(s: Any, probe: Probe, jobs: int, loops: int) -> Measured:
    """Submit ``jobs`` at once and wait for all; the window is the whole run."""
    start = time.perf_counter()
    futures: list[Future[Outcome]] = [s.submit(burn, loops) for _ in range(jobs)]
    wait_futures(futures)
    wall = time.perf_counter() - start
    window = probe.mark()
    outcomes = [f.result() for f in futures]
    own = sum(cpu for _, cpu in outcomes)
    return Measured(window, own, f"wall {wall:.3f} s; efficiency {own / WORKERS / wall:.3f}")


def measure(title: str, jobs: int, run: Callable[[Any, Probe], Measured]) -> None:
    """One fresh Scheduler, warmed; ``run`` measures; then the table, per job."""
    with scheduler(workers=WORKERS) as s:
        wait_futures([s.submit(noop) for _ in range(20)])
        wait_futures([s.submit(burn, 1_000) for _ in range(WORKERS)])
        roles = {os.getpid(): "client", s._manager_process.pid: "manager"}
        roles.update({w.pid: f"worker {w.worker_id}" for w in s.stats().workers})
        probe = Probe(list(roles))
        measured = run(s, probe)
        names = {pid: thread_names(pid) for pid in roles}  # after: threads made in the run
    window = measured.window
    workers = sum(cpu for pid, cpu in window.totals.items() if roles[pid].startswith("worker"))
    print(
        f"\n== {title}\n{measured.summary}; jobs' own CPU {measured.own_cpu / jobs * 1e6:.1f}"
        f" µs per job, workers' beyond it {(workers - measured.own_cpu) / jobs * 1e6:.1f}"
    )
    if measured.submit is not None:
        print(
            "submit phase, CPU µs per job: "
            + ", ".join(
                f"{role} {measured.submit.totals[pid] / jobs * 1e6:.1f}"
                for pid, role in roles.items()
            )
        )
    print()
    print(
        f"{'process':<12} {'pid':>7} {'tid':>7}  {'thread':<62} "
        f"{'CPU µs/job':>10} {'vol cs/job':>10} {'invol/job':>9}"
    )
    for pid, role in roles.items():
        rows = sorted(window.threads[pid].items(), key=lambda item: -item[1].cpu_ns)
        for tid, counts in rows:
            name = names[pid].get(tid, "(no name: exited, or py-spy missing)")
            print(
                f"{role:<12} {pid:>7} {tid:>7}  {name[:62]:<62} "
                f"{counts.cpu_ns / 1e3 / jobs:>10.2f} {counts.voluntary / jobs:>10.3f} "
                f"{counts.involuntary / jobs:>9.3f}"
            )
        threads_us = sum(c.cpu_ns for c in window.threads[pid].values()) / 1e3 / jobs
        total = f"all threads, by the process CPU clock (live ones: {threads_us:.2f})"
        print(
            f"{role:<12} {pid:>7} {'':>7}  {total:<62} {window.totals[pid] / jobs * 1e6:>10.2f}\n"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1_000, help="trickle: jobs a second")
    parser.add_argument("--seconds", type=float, default=5.0, help="trickle: its span")
    parser.add_argument("--jobs", type=int, default=2_000, help="batch: jobs at once")
    parser.add_argument("--job-ms", type=float, default=2.0, help="batch: CPU per job")
    args = parser.parse_args(argv)
    os.chdir(measured_package_root())  # see benchmarks/README.md: the forkserver's path
    trickle_jobs = round(args.rate * args.seconds)
    one_ms, batch_loops = calibrate_burn(0.001), calibrate_burn(args.job_ms / 1e3)
    measure(
        f"trickle: {trickle_jobs:,} jobs of 1 ms, {args.rate:,} a second over "
        f"{args.seconds:g} s, {WORKERS} workers; window: the due phase",
        trickle_jobs,
        lambda s, probe: run_trickle(s, probe, trickle_jobs, args.rate, one_ms),
    )
    measure(
        f"batch: {args.jobs:,} jobs of {args.job_ms:g} ms at once, {WORKERS} workers; "
        "window: first submit to last result",
        args.jobs,
        lambda s, probe: run_batch(s, probe, args.jobs, batch_loops),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
