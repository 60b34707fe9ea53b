"""Run the benchmarks side by side and write benchmarks/README.md and lateness_cdf.png.

    python benchmarks/run.py [--quick] [--only NAME ...] [--repeats N] [--no-readme]

NAME is one of: throughput, lateness, scaling, idle, herd, scale, durable, payloads,
recurring, breakdown, redis (section 10: needs redis-server and the bench extra's RQ,
arq and Celery), cpu (section 11: CPU-heavy work, ~12 minutes alone). The full run takes
about 40 minutes on 2 cores; ``--quick`` (smaller sizes, 2 repeats) about 5.
Progress goes to stderr. Timing claims live here, never in tests.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # Appended, not prepended: a PYTHONPATH entry (e.g. a snapshot of mpsched) still wins.
    sys.path.append(str(ROOT))
# Pool workers of every peer import benchmarks.jobs; children inherit this.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p
)

from benchmarks import (  # noqa: E402
    bench_breakdown,
    bench_cpu,
    bench_durable,
    bench_herd,
    bench_idle,
    bench_lateness,
    bench_payloads,
    bench_recurring,
    bench_redis,
    bench_scale,
    bench_scaling,
    bench_throughput,
    report,
)
from benchmarks._common import Section, log, machine, measured_package_root  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is; the issue's numbers are the full run."""

    repeats: int
    throughput_jobs: int
    lateness: tuple[int, float, int]  # jobs, span (s), instants carrying 2 jobs
    scaling: tuple[int, float]  # jobs, seconds per job
    idle_window: float
    herd: tuple[int, int, float]  # workers, jobs, span (s)
    scale: tuple[int, int, int]  # big pending, small pending, jobs through the manager
    # dispatched jobs, jobs submitted into a store, APScheduler's, pending jobs recovered
    durable: tuple[int, int, int, int]
    payloads: float  # share of the job counts per payload case
    recurring: int  # runs of the 10 ms schedule
    redis: tuple[int, tuple[int, float, int]]  # no-op jobs; lateness plan (as lateness)
    # CPU seconds per efficiency run, trickle (jobs/s, seconds), no-op jobs vs Pool
    cpu: tuple[float, tuple[int, float], int]


FULL = Sizes(
    repeats=5,
    throughput_jobs=20_000,
    lateness=(500, 5.0, 100),
    scaling=(40, 0.05),
    idle_window=10.0,
    herd=(32, 2_000, 1.0),
    scale=(1_000_000, 1_000, 20_000),
    durable=(20_000, 100_000, 3_000, 1_000_000),
    payloads=1.0,
    recurring=1_000,
    redis=(5_000, (500, 5.0, 100)),
    cpu=(4.0, (1_000, 20.0), 20_000),
)
QUICK = Sizes(
    repeats=2,
    throughput_jobs=2_000,
    lateness=(200, 2.0, 40),
    scaling=(16, 0.05),
    idle_window=2.0,
    herd=(32, 500, 0.5),
    scale=(100_000, 1_000, 2_000),
    durable=(2_000, 10_000, 500, 100_000),
    payloads=0.2,
    recurring=200,
    redis=(1_000, (200, 2.0, 40)),
    cpu=(1.0, (1_000, 3.0), 2_000),
)

BENCHMARKS: dict[str, Callable[[Sizes, int], Section]] = {
    "throughput": lambda z, r: bench_throughput.bench(z.throughput_jobs, r),
    "lateness": lambda z, r: bench_lateness.bench(*z.lateness, r),
    "scaling": lambda z, r: bench_scaling.bench(*z.scaling, r),
    "idle": lambda z, r: bench_idle.bench(z.idle_window, r),
    "herd": lambda z, r: bench_herd.bench(*z.herd, r),
    "scale": lambda z, r: bench_scale.bench(*z.scale, r),
    "durable": lambda z, r: bench_durable.bench(*z.durable, r),
    "payloads": lambda z, r: bench_payloads.bench(z.payloads, r),
    "recurring": lambda z, r: bench_recurring.bench(z.recurring, r),
    "breakdown": lambda z, r: bench_breakdown.bench(r),
    # 3 repeats at most: the peers' redelivery waits, and their workers start slowly
    "redis": lambda z, r: bench_redis.bench(z.redis[0], z.redis[1], min(r, 3)),
    "cpu": lambda z, r: bench_cpu.bench(*z.cpu, r),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark mpsched against its peers, side by side."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 repeats")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(BENCHMARKS),
        metavar="NAME",
        help=f"run only these: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--repeats", type=int, help="repeats per comparison (default 5)")
    parser.add_argument(
        "--no-readme",
        action="store_true",
        help="print the results; leave README.md and latest.json alone",
    )
    args = parser.parse_args(argv)
    os.chdir(measured_package_root())  # see its docstring: the forkserver imports from cwd
    _check_workers_import_the_same_mpsched()
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or sizes.repeats
    command = "python benchmarks/run.py" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    started = time.monotonic()
    sections = []
    for name in args.only or list(BENCHMARKS):
        log(f"--- {name}")
        begin, load = time.monotonic(), os.getloadavg()[0]
        section = BENCHMARKS[name](sizes, repeats)
        section.seconds = time.monotonic() - begin
        section.load = f"{load:.2f} → {os.getloadavg()[0]:.2f}"
        sections.append(section)
        if section.samples and not args.no_readme:
            report.chart(section.samples, f"{section.title}; {repeats} repeats pooled")
        if section.curves and not args.no_readme:
            report.efficiency_chart(
                section.curves,
                f"{section.title.split(':')[0]}: efficiency; median and range of {repeats} repeats",
            )
    run = {
        "command": command,
        "repeats": repeats,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": (time.monotonic() - started) / 60,
        "machine": machine(),
    }
    if args.no_readme:
        print(
            report.render(
                {"sections": {s.key: _as_record(s, run) for s in sections}, "last_run": run}
            )
        )
        return 0
    report.write_readme(report.save(sections, run))
    log(f"wrote {report.README} and {report.LATEST} in {run['minutes']:.1f} min")
    return 0


def _check_workers_import_the_same_mpsched() -> None:
    import mpsched
    from benchmarks._common import scheduler
    from benchmarks.jobs import mpsched_location

    with scheduler(workers=1) as s:
        there = s.submit(mpsched_location).result()
    if Path(there).resolve() != Path(mpsched.__file__).resolve():
        raise SystemExit(
            f"workers import mpsched from {there}, this process from "
            f"{mpsched.__file__}: run from the measured package's directory"
        )
    log(f"measuring mpsched from {Path(there).parent}")


def _as_record(section: Section, run: dict[str, object]) -> dict[str, object]:
    from dataclasses import asdict

    return {**asdict(section), "run": run}


if __name__ == "__main__":
    raise SystemExit(main())
