"""What every benchmark shares: alternating runs, summaries, CPU accounting, machine facts.

A benchmark returns a :class:`Section`: per contender and metric, one value per repeat.
Contenders run alternately inside each repeat, in an order rotated by one each repeat, so a
slow phase of a noisy machine hits all of them alike; comparisons are made per repeat (a
ratio of two values from the same repeat) and then summarised as median with min-max.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

Result = dict[str, float]
Contender = tuple[str, Callable[[], Result]]


@dataclass
class Metric:
    """One measured quantity of one contender: a value per repeat."""

    contender: str
    name: str
    unit: str
    values: list[float]
    digits: int = 3  # significant digits in the table

    def summary(self) -> str:
        return summarise(self.values, self.digits)


@dataclass
class Target:
    """A goal from the issue and how this run measured against it."""

    goal: str
    measured: str
    met: bool | None  # None: could not be measured in this run


@dataclass
class Section:
    """The result of one benchmark, ready for the report."""

    key: str
    title: str
    setup: str  # what ran, at which level (processes, or JobQueue with threads)
    metrics: list[Metric] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)  # e.g. lateness, for a CDF
    # y values per repeat at each x (as text), per contender: section 11's efficiency chart
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    seconds: float = 0.0  # wall time the benchmark took
    load: str = ""  # 1-minute load average before and after (this benchmark included)

    def add(
        self, contender: str, name: str, unit: str, values: Sequence[float], digits: int = 3
    ) -> Metric:
        metric = Metric(contender, name, unit, [float(v) for v in values], digits)
        self.metrics.append(metric)
        return metric


def log(message: str) -> None:
    """Progress goes to stderr; the report is the only output that matters."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def alternate(
    contenders: Sequence[Contender], repeats: int, label: str = ""
) -> dict[str, list[Result]]:
    """Run every contender once per repeat, rotating the order by one each repeat."""
    results: dict[str, list[Result]] = {name: [] for name, _ in contenders}
    for r in range(repeats):
        shift = r % len(contenders)
        for name, run in [*contenders[shift:], *contenders[:shift]]:
            start = time.perf_counter()
            result = run()
            results[name].append(result)
            log(
                f"{label} repeat {r + 1}/{repeats} {name}: {_brief(result)} "
                f"({time.perf_counter() - start:.1f} s)"
            )
    return results


def column(results: Sequence[Result], key: str) -> list[float]:
    return [r[key] for r in results]


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repeat ratios a/b (values paired by repeat)."""
    return [x / y if y else math.inf for x, y in zip(a, b, strict=True)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarise(values: Sequence[float], digits: int = 3) -> str:
    """``median (min-max)`` with ``digits`` significant digits."""
    if not values:
        return "n/a"
    med, low, high = median(values), min(values), max(values)
    if len(values) == 1:
        return _num(med, digits)
    return f"{_num(med, digits)} ({_num(low, digits)}\u2013{_num(high, digits)})"


def _num(value: float, digits: int) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if abs(value) < 1e-9:  # float noise of a difference, e.g. 1e-12 cores
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{value:,.{decimals}f}"
    return text


def _brief(result: Result) -> str:
    return ", ".join(f"{k}={_num(v, 3)}" for k, v in list(result.items())[:4])


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max by nearest rank (as mpsched's own stats())."""
    ordered = sorted(samples)
    if not ordered:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    last = len(ordered) - 1

    def rank(q: float) -> float:
        return ordered[min(last, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[last]}


# ------------------------------------------------------------------- processes, CPU


def cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` (all threads); gone processes count 0."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def kernel_cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """System (kernel) CPU seconds of ``procs``: syscalls, socket I/O, futex wake-ups."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += proc.cpu_times().system
    return total


def precise_cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """CPU seconds of ``procs`` at nanosecond resolution, for short or idle windows.

    psutil reads /proc/PID/stat, which counts in clock ticks (10 ms here): too coarse for
    a target of 0.05 s over 10 s. /proc/PID/task/TID/schedstat counts nanoseconds on CPU
    per live thread (threads that exit inside the window are missed; none do in the
    windows this is used for). Falls back to psutil where schedstat is unavailable.
    """
    total = 0.0
    for proc in procs:
        total += _schedstat_seconds(proc)
    return total


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """One thread's CPU seconds from its schedstat (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _schedstat_seconds(proc: psutil.Process) -> float:
    task_dir = Path(f"/proc/{proc.pid}/task")
    try:
        tids = [int(t.name) for t in task_dir.iterdir()]
    except OSError:
        return cpu_seconds([proc])
    return sum(thread_cpu_seconds(proc.pid, tid) for tid in tids)


def rss_bytes(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def pool_processes() -> list[psutil.Process]:
    """Every descendant of this process (a peer's pool workers and helpers)."""
    return list(psutil.Process().children(recursive=True))


def mpsched_processes(s: Any) -> dict[str, list[psutil.Process]]:
    """The processes of a running Scheduler by role (the manager and worker pids)."""
    workers = [psutil.Process(w.pid) for w in s.stats().workers]
    return {
        "client": [psutil.Process()],
        "manager": [psutil.Process(s._manager_process.pid)],
        "workers": workers,
    }


class OtherLoad:
    """CPU used by processes outside this benchmark's process tree during a window, in cores.

    The machine is shared and small: a test suite running elsewhere steals a core from a
    2-worker run. System-wide busy time (steal included) minus this process and its
    descendants, over the window's wall time. Processes must not exit inside the window.
    """

    def __enter__(self) -> OtherLoad:
        self.cores = math.nan
        self._tree = CpuMeter([psutil.Process(), *pool_processes()])
        self._start = (time.perf_counter(), _busy_seconds())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0 = self._start
        wall = time.perf_counter() - wall0
        other = (_busy_seconds() - busy0) - self._tree.used()
        self.cores = max(0.0, other / wall) if wall > 0 else math.nan


class CpuMeter:
    """CPU seconds a set of processes used since this was made.

    Per process, so one that exits in between (a previous pool winding down) is left out
    instead of subtracting everything it had ever used from the total.
    """

    def __init__(self, procs: Sequence[psutil.Process]) -> None:
        self._start = {proc: cpu_seconds([proc]) for proc in procs}

    def used(self) -> float:
        total = 0.0
        for proc, start in self._start.items():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                times = proc.cpu_times()
                total += times.user + times.system - start
        return total


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def measured_package_root() -> Path:
    """The directory holding the ``mpsched`` package being measured.

    Run from there: multiprocessing's forkserver (mpsched's default start method) starts
    with ``''`` (the working directory) first on ``sys.path`` and ignores the parent's path,
    so from any other directory holding an ``mpsched/`` its workers would import that one.
    """
    import mpsched

    return Path(mpsched.__file__).resolve().parent.parent


@contextlib.contextmanager
def scheduler(**options: Any) -> Iterator[Any]:
    """A running mpsched Scheduler that is always shut down, cancelling far-future jobs.

    ``with Scheduler(...)`` alone would wait for jobs due in an hour; cancelling first
    keeps every benchmark bounded.
    """
    from mpsched import Scheduler

    with Scheduler(**options) as s:
        try:
            yield s
        finally:
            s.shutdown(wait=True, cancel_futures=True)


def in_fresh_process(fn: Callable[..., Result], *args: Any) -> Result:
    """Run ``fn(*args)`` in a new spawned interpreter (clean heap for memory figures)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# ----------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    """Facts that make a table comparable with another machine's."""
    return {
        "cores": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": platform.platform(),
        "mpsched": _git_revision(),
        "niceness": str(os.nice(0)),
        "packages": ", ".join(
            f"{name} {_version(name)}" for name in ("cloudpickle", "loky", "apscheduler", "psutil")
        ),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def _git_revision() -> str:
    """Which mpsched was measured: this checkout (commit, dirty or not) or a snapshot."""
    import mpsched

    package = Path(mpsched.__file__).resolve().parent
    if package.parent != ROOT:
        revision = package.parent / "REVISION"  # a `git archive` snapshot may leave one
        tag = revision.read_text().strip() if revision.exists() else "?"
        return f"snapshot of {tag} at {package.parent}"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "mpsched"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + uncommitted changes in mpsched/" if dirty else head
