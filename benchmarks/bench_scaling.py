"""3. CPU-bound scaling: pure-Python jobs of ~50 ms on 1 and on 2 workers.

The speed-up is paired per repeat (the 1-worker and 2-worker runs of the same repeat).
ProcessPoolExecutor runs the same jobs as the reference for what the machine allows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from multiprocessing import get_context

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
from benchmarks.jobs import calibrate_spin, noop, spin


def run_mpsched(workers: int, jobs: int, loops: int) -> Result:
    with scheduler(workers=workers) as s:
        wait_futures([s.submit(noop) for _ in range(4 * workers)])
        return _timed(lambda: wait_futures([s.submit(spin, loops) for _ in range(jobs)]))


def run_process_pool(workers: int, jobs: int, loops: int) -> Result:
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        wait_futures([pool.submit(noop) for _ in range(4 * workers)])
        return _timed(lambda: wait_futures([pool.submit(spin, loops) for _ in range(jobs)]))


def _timed(work: Callable[[], object]) -> Result:
    with OtherLoad() as other:
        start = time.perf_counter()
        work()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "other_cores": other.cores}


def bench(jobs: int, job_seconds: float, repeats: int) -> Section:
    """Time ``jobs`` CPU-bound jobs on 1 and 2 workers, for mpsched and the stdlib pool."""
    loops = calibrate_spin(job_seconds)
    section = Section(
        key="scaling",
        title=f"3. CPU-bound scaling: {jobs} pure-Python jobs of ~{job_seconds * 1e3:.0f} ms",
        setup=(
            f"Processes. `spin({loops:,})` was calibrated to ~{job_seconds * 1e3:.0f} ms in "
            "the benchmark process. Wall time from the first submit to the last result; "
            f"ideal: {jobs * job_seconds:.2f} s on 1 worker, "
            f"{jobs * job_seconds / 2:.2f} s on 2."
        ),
    )
    contenders = [
        (f"{name} {w}w", lambda fn=fn, w=w: fn(w, jobs, loops))
        for name, fn in (("mpsched", run_mpsched), ("ProcessPoolExecutor", run_process_pool))
        for w in (1, 2)
    ]
    results = alternate(contenders, repeats, "scaling")
    for name in ("mpsched", "ProcessPoolExecutor"):
        ones, twos = results[f"{name} 1w"], results[f"{name} 2w"]
        one, two = column(ones, "seconds"), column(twos, "seconds")
        section.add(name, "wall time, 1 worker", "s", one)
        section.add(name, "wall time, 2 workers", "s", two)
        section.add(
            name,
            "other processes' CPU during the 2-worker runs",
            "cores",
            column(twos, "other_cores"),
        )
        speedup = ratios(one, two)
        section.add(name, "speed-up 2 vs 1 worker, per repeat", "x", speedup)
        best = min(one) / min(two)
        section.add(name, "speed-up of the fastest runs (min ÷ min)", "x", [best])
        if name == "mpsched":
            section.targets.append(
                Target(
                    "CPU-bound speed-up on 2 workers ≥ 1.9x (per repeat; fastest runs)",
                    f"{summarise(speedup)}x; {best:.2f}x",
                    median(speedup) >= 1.9,
                )
            )
    section.notes.append(
        "CPU-bound runs only get slower from noise, so the fastest runs estimate the "
        "uncontended speed-up; the per-repeat figures show how often another tenant of "
        "this 2-core machine took a core (see the other-processes row)."
    )
    return section
