"""11. CPU-heavy work: how much of 2 cores the jobs themselves get, mpsched against the pools.

Three measurements, each with its contenders alternating inside every repeat:

- **Efficiency.** For each job length L (0.5 to 50 ms of pure-Python CPU, ``spin``
  calibrated on this process's CPU clock), N jobs submitted at once, then waited for: the jobs' own
  CPU seconds (``time.thread_time()`` inside each job, returned with its result) ÷ 2
  workers ÷ the wall time from the first submit to the last result. 1.0 is the physical
  limit of 2 cores. The CPU every other process of the contender used is split by role:
  mpsched's client and manager, a peer's parent process, the workers beyond their jobs.
- **Trickle** (``bench_cpu_trickle``): jobs due one by one at a steady rate, mpsched
  against APScheduler 3.
- **No-op dispatch** against ``multiprocessing.Pool.apply_async``: section 1's runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from functools import partial
from multiprocessing import get_context
from multiprocessing.pool import AsyncResult
from typing import Any

import psutil

from benchmarks import bench_cpu_trickle, bench_throughput
from benchmarks._common import (
    OtherLoad,
    Result,
    Section,
    Target,
    alternate,
    column,
    median,
    mpsched_processes,
    pool_processes,
    ratios,
    scheduler,
    summarise,
)
from benchmarks._threads import ProcessMeter
from benchmarks.jobs import burn, calibrate_burn, noop

WORKERS = 2
LENGTHS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 50.0)
WARM = 20  # no-op jobs each pool runs before the clock starts (and 2 short burns)
EFFICIENCY_GOALS = {2.0: 0.97, 10.0: 0.99}  # job length (ms) -> efficiency target
NOOP_GOAL = 1.0  # x Pool.apply_async

Outcome = tuple[float, float]  # a burn's start (wall clock) and its own CPU seconds
Roles = dict[str, list[psutil.Process]]


def batch_size(cpu_seconds: float, length_ms: float) -> int:
    """Jobs of ``length_ms`` that carry ``cpu_seconds`` of CPU in all."""
    return max(WORKERS, round(cpu_seconds / (length_ms / 1e3)))


def _measure(
    roles: Roles,
    submit_all: Callable[[], Any],
    wait_all: Callable[[Any], Sequence[Outcome]],
    jobs: int,
) -> Result:
    """Submit every job, wait for every result; the clock runs from first submit to last."""
    meters = {role: ProcessMeter(procs) for role, procs in roles.items()}
    with OtherLoad() as other:
        start = time.perf_counter()
        outcomes = wait_all(submit_all())
        wall = time.perf_counter() - start
    used = {role: meter.read() for role, meter in meters.items()}
    job_cpu = sum(cpu for _, cpu in outcomes)
    result = {
        "efficiency": job_cpu / WORKERS / wall,
        "wall_s": wall,
        "job_cpu_ms": job_cpu / jobs * 1e3,
        "other_cores": other.cores,
    }
    for role, seconds in used.items():
        if role == "workers":
            result["cpu_us_workers_beyond_jobs"] = (seconds - job_cpu) / jobs * 1e6
        else:
            result[f"cpu_us_{role}"] = seconds / jobs * 1e6
    return result


def _futures(pending: list[Future[Outcome]]) -> list[Outcome]:
    wait_futures(pending)
    return [f.result() for f in pending]


def _async_results(pending: list[AsyncResult[Outcome]]) -> list[Outcome]:
    for r in pending:
        r.wait()
    return [r.get() for r in pending]


def _warm(submit: Callable[..., Any], wait_all: Callable[[list[Any]], Any], loops: int) -> None:
    wait_all([submit(noop) for _ in range(WARM)])
    wait_all([submit(burn, min(loops, 1_000)) for _ in range(WORKERS)])


def run_mpsched(jobs: int, loops: int) -> Result:
    with scheduler(workers=WORKERS) as s:
        _warm(s.submit, wait_futures, loops)
        roles = mpsched_processes(s)
        return _measure(roles, lambda: [s.submit(burn, loops) for _ in range(jobs)], _futures, jobs)


def _peer_roles() -> Roles:
    return {"parent": [psutil.Process()], "workers": pool_processes()}


def run_process_pool(jobs: int, loops: int) -> Result:
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=get_context("fork")) as pool:
        _warm(pool.submit, wait_futures, loops)
        return _measure(
            _peer_roles(), lambda: [pool.submit(burn, loops) for _ in range(jobs)], _futures, jobs
        )


def run_mp_pool(jobs: int, loops: int) -> Result:
    with get_context("fork").Pool(WORKERS) as pool:
        _warm(lambda fn, *args: pool.apply_async(fn, args), _async_results, loops)
        return _measure(
            _peer_roles(),
            lambda: [pool.apply_async(burn, (loops,)) for _ in range(jobs)],
            _async_results,
            jobs,
        )


def run_loky(jobs: int, loops: int) -> Result:
    from loky import get_reusable_executor

    pool = get_reusable_executor(max_workers=WORKERS)
    try:
        _warm(pool.submit, wait_futures, loops)
        return _measure(
            _peer_roles(), lambda: [pool.submit(burn, loops) for _ in range(jobs)], _futures, jobs
        )
    finally:
        pool.shutdown(wait=True)


MPSCHED = "mpsched"
CONTENDERS: dict[str, Callable[[int, int], Result]] = {
    MPSCHED: run_mpsched,
    "ProcessPoolExecutor": run_process_pool,
    "Pool.apply_async": run_mp_pool,
    "loky (reusable executor)": run_loky,
}
PEERS = [name for name in CONTENDERS if name != MPSCHED]
ROLE_ROWS = (
    ("cpu_us_client", "client"),
    ("cpu_us_manager", "manager"),
    ("cpu_us_parent", "parent process"),
    ("cpu_us_workers_beyond_jobs", "workers, beyond the jobs' own"),
)


def label(jobs: int, length_ms: float) -> str:
    return f"{jobs:,} x {length_ms:g} ms"


def bench(cpu_seconds: float, trickle: tuple[int, float], noop_jobs: int, repeats: int) -> Section:
    """Efficiency per job length, the trickle, and no-op dispatch against Pool.apply_async.

    ``cpu_seconds``: CPU each efficiency run carries (N = cpu_seconds / L); ``trickle``:
    jobs per second and seconds of the steady stream; ``noop_jobs``: section 1's size.
    """
    section = Section(key="cpu", title="", setup="")
    curves: dict[str, dict[str, list[float]]] = {name: {} for name in CONTENDERS}
    sizes = []
    for length_ms in LENGTHS_MS:
        jobs = batch_size(cpu_seconds, length_ms)
        loops = calibrate_burn(length_ms / 1e3)
        sizes.append(f"`spin({loops:,})` for {length_ms:g} ms")
        results = alternate(
            [(name, partial(fn, jobs, loops)) for name, fn in CONTENDERS.items()],
            repeats,
            f"cpu {label(jobs, length_ms)}",
        )
        _efficiency_rows(section, results, jobs, length_ms)
        for name, runs in results.items():
            curves[name][f"{length_ms:g}"] = column(runs, "efficiency")
    section.curves = curves
    rate, span = trickle
    trickle_jobs = bench_cpu_trickle.add_rows(section, rate, span, repeats)
    _noop_rows(section, noop_jobs, repeats)
    section.title = (
        f"11. CPU-heavy work: efficiency of jobs of 0.5 to 50 ms on {WORKERS} "
        f"workers, a trickle of {trickle_jobs:,} jobs of 1 ms over {span:g} s, "
        "no-op dispatch"
    )
    section.setup = _setup(cpu_seconds, sizes, rate, span, noop_jobs)
    return section


def _efficiency_rows(
    section: Section, results: dict[str, list[Result]], jobs: int, length_ms: float
) -> None:
    size = label(jobs, length_ms)
    for name, runs in results.items():
        section.add(name, f"{size}: efficiency", "", column(runs, "efficiency"))
        section.add(name, f"{size}: jobs' own CPU per job", "ms", column(runs, "job_cpu_ms"))
        for key, role in ROLE_ROWS:
            if key in runs[0]:
                section.add(name, f"{size}: CPU per job, {role}", "µs", column(runs, key))
        section.add(
            name,
            f"{size}: other processes' CPU during the run",
            "cores",
            column(runs, "other_cores"),
        )
    mine = column(results[MPSCHED], "efficiency")
    best_peer = [
        max(values)
        for values in zip(*(column(results[p], "efficiency") for p in PEERS), strict=True)
    ]
    lead = [a - b for a, b in zip(mine, best_peer, strict=True)]
    section.add(MPSCHED, f"{size}: efficiency minus the best peer's of the same repeat", "", lead)
    goal = EFFICIENCY_GOALS.get(length_ms)
    if goal is None:
        return
    met = median(mine) >= goal
    measured = f"{summarise(mine)}"
    name = f"CPU-heavy: {size} jobs at once, efficiency ≥ {goal}"
    if length_ms == 2.0:
        name += " and above every peer's of the same repeat"
        measured += f"; minus the best peer's: {summarise(lead)}"
        met = met and median(lead) > 0
    section.targets.append(Target(name, measured, met))


def _noop_rows(section: Section, jobs: int, repeats: int) -> None:
    """Section 1's mpsched and Pool.apply_async runs, alternating, and their ratio."""
    results = alternate(
        [
            (MPSCHED, partial(bench_throughput.run_mpsched, jobs, WORKERS)),
            ("Pool.apply_async", partial(bench_throughput.run_mp_pool, jobs, WORKERS)),
        ],
        repeats,
        "cpu no-op",
    )
    for name, runs in results.items():
        section.add(
            name,
            f"no-op {jobs:,}: jobs/s (submit → last result)",
            "jobs/s",
            column(runs, "jobs_per_s"),
        )
    rel = ratios(
        column(results[MPSCHED], "jobs_per_s"), column(results["Pool.apply_async"], "jobs_per_s")
    )
    section.add(MPSCHED, f"no-op {jobs:,}: throughput ÷ Pool.apply_async", "x", rel)
    section.targets.append(
        Target(
            f"CPU-heavy section: no-op dispatch ({jobs:,} jobs) ≥ {NOOP_GOAL}x Pool.apply_async",
            f"{summarise(rel)}x",
            median(rel) >= NOOP_GOAL,
        )
    )


def _setup(cpu_seconds: float, sizes: list[str], rate: int, span: float, noop_jobs: int) -> str:
    return (
        "Processes, 2 workers, a fresh pool per contender and run, warmed with "
        f"{WARM} no-op jobs. **Efficiency**: N jobs of L ms of pure-Python CPU "
        f"(N x L = {cpu_seconds:g} s; {', '.join(sizes)}, calibrated on this process's "
        "CPU clock) submitted at once, then waited for. Efficiency = the jobs' own CPU "
        "seconds (`time.thread_time()` around the `spin` inside each job, returned with "
        "its result) ÷ 2 ÷ the wall time from the first submit to the last result; 1.0 "
        "is what 2 cores allow. CPU per job by role comes from each process's CPU clock "
        "(ns, threads that exited included): mpsched's client and manager, a peer's "
        "parent process (where its pool's threads run), the workers minus the jobs' own "
        "CPU. ProcessPoolExecutor and Pool fork, mpsched forkserves, loky's reusable "
        "executor (`get_reusable_executor(max_workers=2)`, shut down after each run) "
        f"spawns its own. **Trickle**: {rate:,} jobs a second due evenly over {span:g} s, "
        "1 ms of CPU each, all submitted before the first falls due: mpsched "
        "`schedule(burn, loops, at=start + i / rate)`, then `concurrent.futures.wait`; "
        "APScheduler 3 (BackgroundScheduler, MemoryJobStore, its ProcessPoolExecutor "
        "with 2 workers, misfire grace off, `add_job(burn, 'date', run_date=...)`). "
        "Lateness = the job's `time.time()` at its start minus its `at`. CPU per job is "
        "over the whole run (first submit to last result), the submit phase (until the "
        "last submit is acknowledged: `stats()` flushes mpsched's write-behind outbox) "
        "and the due phase (from there to the last result). **No-op dispatch**: section "
        f"1's mpsched and Pool.apply_async runs ({noop_jobs:,} no-op jobs), alternating."
    )
