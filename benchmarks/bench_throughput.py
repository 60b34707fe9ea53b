"""1. Dispatch throughput: N no-op jobs due now on 2 workers, mpsched against three pools,
and against itself with its status page open and its metrics scraped every second.

Each contender gets a fresh, warmed pool (workers started and the job module imported);
the clock runs from the first submit to the last result. CPU per job is split by process
role so the profile section can say where the time goes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from functools import partial
from multiprocessing import get_context
from multiprocessing.pool import AsyncResult
from typing import Any

import psutil

from benchmarks._common import (
    CpuMeter,
    OtherLoad,
    Result,
    Section,
    Target,
    alternate,
    column,
    cpu_seconds,
    kernel_cpu_seconds,
    median,
    mpsched_processes,
    pool_processes,
    ratios,
    scheduler,
    summarise,
)
from benchmarks.jobs import noop, noop_arg
from benchmarks.watched import watching

WARM = 200  # jobs each pool runs before the clock starts


def run_mpsched(jobs: int, workers: int) -> Result:
    """One ``submit`` call per job, like every peer."""
    return _run_mpsched(
        jobs, workers, lambda s: [s.submit(noop) for _ in range(jobs)], wait_futures
    )


def run_mpsched_watched(jobs: int, workers: int) -> Result:
    """As ``run_mpsched``, with the status page open and ``/metrics`` scraped each second."""
    return _run_mpsched(
        jobs, workers, lambda s: [s.submit(noop) for _ in range(jobs)], wait_futures, watched=True
    )


def run_mpsched_map(jobs: int, workers: int) -> Result:
    """``map``: batched submits where mpsched batches them (72f0278 on)."""
    return _run_mpsched(jobs, workers, lambda s: s.map(noop_arg, range(jobs)), list)


def _run_mpsched(
    jobs: int,
    workers: int,
    submit_all: Callable[[Any], Any],
    wait_all: Callable[[Any], Any],
    watched: bool = False,
) -> Result:
    with scheduler(workers=workers, http="127.0.0.1:0" if watched else None) as s:
        wait_futures([s.submit(noop) for _ in range(WARM)])
        roles = mpsched_processes(s)
        before = {role: cpu_seconds(procs) for role, procs in roles.items()}
        kernel0 = {role: kernel_cpu_seconds(procs) for role, procs in roles.items()}
        # Annotated: mypy joins the two context managers' types to ABC, which has no __enter__.
        watch: contextlib.AbstractContextManager[dict[str, float]] = (
            watching(s.http_url) if watched else contextlib.nullcontext({})
        )
        with watch as requests, OtherLoad() as other:
            start = time.perf_counter()
            pending = submit_all(s)
            submitted = time.perf_counter()
            wait_all(pending)
            end = time.perf_counter()
        used = {role: cpu_seconds(procs) - before[role] for role, procs in roles.items()}
        kernel = {role: kernel_cpu_seconds(procs) - kernel0[role] for role, procs in roles.items()}
    result = {
        "jobs_per_s": jobs / (end - start),
        "submit_per_s": jobs / (submitted - start),
        "other_cores": other.cores,
        **{f"http_{k}": v for k, v in requests.items()},
    }
    result["cpu_us_per_job"] = sum(used.values()) / jobs * 1e6
    for role, seconds in used.items():
        result[f"cpu_us_{role}"] = seconds / jobs * 1e6
        result[f"kernel_us_{role}"] = kernel[role] / jobs * 1e6
    return result


def run_process_pool(jobs: int, workers: int) -> Result:
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        wait_futures([pool.submit(noop) for _ in range(WARM)])
        return _measure(lambda: [pool.submit(noop) for _ in range(jobs)], wait_futures, jobs)


def run_loky(jobs: int, workers: int) -> Result:
    from loky import ProcessPoolExecutor as LokyExecutor

    with LokyExecutor(max_workers=workers) as pool:
        wait_futures([pool.submit(noop) for _ in range(WARM)])
        return _measure(lambda: [pool.submit(noop) for _ in range(jobs)], wait_futures, jobs)


def run_mp_pool(jobs: int, workers: int) -> Result:
    with get_context("fork").Pool(workers) as pool:
        _wait_async([pool.apply_async(noop) for _ in range(WARM)])
        return _measure(lambda: [pool.apply_async(noop) for _ in range(jobs)], _wait_async, jobs)


def _wait_async(pending: list[AsyncResult[None]]) -> None:
    for r in pending:
        r.wait()


def _measure(submit_all: Callable[[], Any], wait_all: Callable[[Any], Any], jobs: int) -> Result:
    """Time a peer: submit everything, wait for everything; CPU of this process + pool."""
    client_cpu, pool_cpu = CpuMeter([psutil.Process()]), CpuMeter(pool_processes())
    with OtherLoad() as other:
        start = time.perf_counter()
        pending = submit_all()
        submitted = time.perf_counter()
        wait_all(pending)
        end = time.perf_counter()
    client, pool = client_cpu.used(), pool_cpu.used()
    return {
        "jobs_per_s": jobs / (end - start),
        "submit_per_s": jobs / (submitted - start),
        "cpu_us_per_job": (client + pool) / jobs * 1e6,
        "cpu_us_client": client / jobs * 1e6,
        "cpu_us_workers": pool / jobs * 1e6,
        "other_cores": other.cores,
    }


WATCHED = "mpsched, page open + /metrics scraped"
CONTENDERS = {
    "mpsched": run_mpsched,
    WATCHED: run_mpsched_watched,
    "mpsched map()": run_mpsched_map,
    "ProcessPoolExecutor": run_process_pool,
    "Pool.apply_async": run_mp_pool,
    "loky": run_loky,
}


def bench(jobs: int, repeats: int, workers: int = 2) -> Section:
    """Run the throughput comparison and summarise it."""
    section = Section(
        key="throughput",
        title=f"1. Dispatch throughput: {jobs:,} no-op jobs due now, {workers} workers",
        setup=(
            f"Processes. Each repeat starts a fresh pool per contender, runs {WARM} warm-up "
            f"jobs, then times {jobs:,} `submit(noop)` calls plus waiting for every "
            "result (`mpsched map()`: one `map(noop_arg, range(N))` call, then iterating "
            "its results). ProcessPoolExecutor and Pool use their Linux default (fork); "
            "mpsched uses forkserver; loky its own spawn. CPU is user+system of all "
            "threads of the client, the manager (mpsched) and the pool processes. "
            f"`{WATCHED}`: the same as `mpsched`, its manager serving its status page "
            "(`Scheduler(http=...)`) while another process asks, on kept-alive "
            "connections, for `/api/dashboard` (what an open page polls) and `/metrics` "
            "once a second each, from before the clock starts to after it stops."
        ),
    )
    results = alternate(
        [(name, partial(fn, jobs, workers)) for name, fn in CONTENDERS.items()],
        repeats,
        "throughput",
    )
    for name, runs in results.items():
        section.add(name, "jobs/s (submit → last result)", "jobs/s", column(runs, "jobs_per_s"))
        section.add(name, "submit calls/s", "calls/s", column(runs, "submit_per_s"))
        section.add(
            name, "other processes' CPU during the run", "cores", column(runs, "other_cores")
        )
        section.add(name, "CPU per job, all processes", "µs", column(runs, "cpu_us_per_job"))
        for role in ("client", "manager", "workers"):
            key = f"cpu_us_{role}"
            if key in runs[0]:
                section.add(name, f"CPU per job, {role}", "µs", column(runs, key))
            if f"kernel_us_{role}" in runs[0]:
                section.add(
                    name, f"… of which kernel, {role}", "µs", column(runs, f"kernel_us_{role}")
                )
    _watched_rows(section, results)
    for api in ("mpsched", "mpsched map()"):
        mine = column(results[api], "jobs_per_s")
        for peer, goal in (("ProcessPoolExecutor", 1.5), ("Pool.apply_async", 1.0), ("loky", None)):
            rel = ratios(mine, column(results[peer], "jobs_per_s"))
            section.add(api, f"throughput ÷ {peer}", "x", rel)
            if goal is not None:
                section.targets.append(_target(api, peer, goal, rel))
    return section


def _target(api: str, peer: str, goal: float, rel: list[float]) -> Target:
    kind = "target" if goal > 1 else "aim"
    how = "submit() per job" if api == "mpsched" else "map()"
    return Target(
        f"throughput, {how}, ≥ {goal}x {peer} ({kind})", f"{summarise(rel)}x", median(rel) >= goal
    )


def _watched_rows(section: Section, results: dict[str, list[Result]]) -> None:
    """The watched run against the same run unwatched, repeat by repeat."""
    runs = results[WATCHED]
    section.add(
        WATCHED,
        "throughput ÷ mpsched unwatched",
        "x",
        ratios(column(runs, "jobs_per_s"), column(results["mpsched"], "jobs_per_s")),
    )
    section.add(
        WATCHED,
        "requests during the run (page poll + scrape)",
        "requests",
        column(runs, "http_requests"),
    )
    section.add(WATCHED, "slowest request during the run", "ms", column(runs, "http_max_ms"))
