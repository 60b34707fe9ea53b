"""8. Jobs that carry data: large arguments and results, mpsched against three pools.

Each case runs N jobs on 2 workers; each job takes one large argument and returns its size
(or takes a size and returns a large ``bytes``). The clock runs from the first submit to
the last result; MiB/s counts the payload bytes of the case's direction. A sampler thread
records, every 5 ms, the RSS of the client (this process) and of mpsched's manager, and
how much /dev/shm holds; each run reports the peaks above its starting level.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from typing import Any

import psutil

from benchmarks._common import (
    OtherLoad,
    Result,
    Section,
    Target,
    alternate,
    column,
    median,
    ratios,
    scheduler,
    summarise,
)
from benchmarks.jobs import make_bytes, nbytes, noop

MIB = 1 << 20


@dataclass(frozen=True)
class Case:
    """One payload shape: what each job carries, and how many jobs are timed."""

    name: str
    size: int  # bytes per job
    jobs: int
    kind: str  # "bytes", "array" (NumPy float64) or "result" (a bytes return value)

    def argument(self) -> Any:
        if self.kind == "array":
            import numpy

            return numpy.ones(self.size // 8)
        return b"\x01" * self.size

    def call(self, submit: Callable[..., Any], data: Any) -> Any:
        if self.kind == "result":
            return submit(make_bytes, self.size)
        return submit(nbytes, data)


def cases(scale: float) -> list[Case]:
    """The issue's sizes; ``scale`` shrinks the job counts (``--quick``)."""
    made = [
        Case("1 MiB bytes", MIB, 400, "bytes"),
        Case("10 MiB bytes", 10 * MIB, 80, "bytes"),
        Case("100 MiB bytes", 100 * MIB, 12, "bytes"),
        Case("10 MiB results", 10 * MIB, 80, "result"),
    ]
    if _numpy():
        made[3:3] = [
            Case("10 MiB arrays", 10 * MIB, 80, "array"),
            Case("100 MiB arrays", 100 * MIB, 12, "array"),
        ]
    return [Case(c.name, c.size, max(4, int(c.jobs * scale)), c.kind) for c in made]


def _numpy() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


class Peaks:
    """Samples memory while a run goes: client and manager RSS, /dev/shm use."""

    def __init__(self, manager_pid: int | None) -> None:
        self._procs = {"client": psutil.Process()}
        if manager_pid is not None:
            self._procs["manager"] = psutil.Process(manager_pid)
        self.peak = {name: 0 for name in (*self._procs, "shm")}
        self._start = self._sample()
        self._stop = threading.Event()  # set by __exit__; the sampler thread waits on it
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[str, int]:
        values = {name: proc.memory_info().rss for name, proc in self._procs.items()}
        values["shm"] = shutil.disk_usage("/dev/shm").used
        return values

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            for name, value in self._sample().items():
                self.peak[name] = max(self.peak[name], value - self._start[name])

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _timed(
    case: Case,
    submit: Callable[..., Any],
    wait_all: Callable[[list[Any]], Any],
    manager_pid: int | None = None,
) -> Result:
    data = None if case.kind == "result" else case.argument()
    with OtherLoad() as other, Peaks(manager_pid) as peaks:
        start = time.perf_counter()
        wait_all([case.call(submit, data) for _ in range(case.jobs)])
        seconds = time.perf_counter() - start
    result = {"mib_per_s": case.jobs * case.size / MIB / seconds, "other_cores": other.cores}
    result.update({f"peak_{name}_mib": value / MIB for name, value in peaks.peak.items()})
    return result


def run_mpsched(case: Case, workers: int, **options: Any) -> Result:
    with scheduler(workers=workers, **options) as s:
        wait_futures([s.submit(noop) for _ in range(4 * workers)])
        return _timed(case, s.submit, wait_futures, s._manager_process.pid)


def run_process_pool(case: Case, workers: int) -> Result:
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        wait_futures([pool.submit(noop) for _ in range(4 * workers)])
        return _timed(case, pool.submit, wait_futures)


def run_loky(case: Case, workers: int) -> Result:
    from loky import ProcessPoolExecutor as LokyExecutor

    with LokyExecutor(max_workers=workers) as pool:
        wait_futures([pool.submit(noop) for _ in range(4 * workers)])
        return _timed(case, pool.submit, wait_futures)


def run_mp_pool(case: Case, workers: int) -> Result:
    with get_context("fork").Pool(workers) as pool:
        for r in [pool.apply_async(noop) for _ in range(4 * workers)]:
            r.wait()
        return _timed(
            case, lambda fn, *a: pool.apply_async(fn, a), lambda pending: [r.get() for r in pending]
        )


CONTENDERS: dict[str, Callable[..., Result]] = {
    "mpsched": run_mpsched,
    "mpsched inline": partial(run_mpsched, shared_memory=False),
    "ProcessPoolExecutor": run_process_pool,
    "Pool.apply_async": run_mp_pool,
    "loky": run_loky,
}


def bench(scale: float, repeats: int, workers: int = 2) -> Section:
    """Run every payload case against every contender and summarise."""
    section = Section(
        key="payloads",
        title=f"8. Jobs that carry data: large arguments and results, {workers} workers",
        setup=(
            "Processes. Per case, each repeat starts a fresh pool per contender, runs "
            "warm-up no-ops, then times N jobs `nbytes(data)` (or `make_bytes(size)` for "
            "results) from the first submit to the last result. MiB/s counts the "
            "payload bytes carried. `mpsched` uses shared memory for buffers of 64 KiB or "
            "more (its default), `mpsched inline` is `shared_memory=False`. Peaks are "
            "above the run's starting level, sampled every 5 ms: client RSS (this "
            "process), manager RSS (mpsched), /dev/shm use (machine-wide). "
            "ProcessPoolExecutor and Pool use fork, loky its own spawn."
        ),
    )
    for case in cases(scale):
        results = alternate(
            [(name, partial(fn, case, workers)) for name, fn in CONTENDERS.items()],
            repeats,
            f"payloads {case.name} x{case.jobs}",
        )
        _summarise(section, case, results)
    return section


def _summarise(section: Section, case: Case, results: dict[str, list[Result]]) -> None:
    label = f"{case.name} x{case.jobs}"
    for name, runs in results.items():
        section.add(name, f"{label}: MiB/s", "MiB/s", column(runs, "mib_per_s"))
        for key in ("client", "manager", "shm"):
            if f"peak_{key}_mib" in runs[0] and (key != "manager" or name.startswith("mps")):
                section.add(name, f"{label}: peak {key}", "MiB", column(runs, f"peak_{key}_mib"))
    mine = column(results["mpsched"], "mib_per_s")
    rel = ratios(mine, column(results["ProcessPoolExecutor"], "mib_per_s"))
    section.add("mpsched", f"{label}: MiB/s ÷ ProcessPoolExecutor", "x", rel)
    goal = 1.5 if case.name == "100 MiB arrays" else 1.0
    section.targets.append(
        Target(
            f"{case.name}: ≥ {goal}x ProcessPoolExecutor's MiB/s",
            f"{summarise(rel)}x",
            median(rel) >= goal,
        )
    )
