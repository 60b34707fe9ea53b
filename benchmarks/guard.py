"""The benchmark guard: the README's headline promises, side by side, in about a minute.

    python benchmarks/guard.py [--repeats N] [--jobs N]      (make bench-guard)

Prints one line per figure, each with its target, and exits 1 when a target is missed:

- throughput: ``--jobs`` no-op ``submit()`` calls on 2 workers, no store, against
  ProcessPoolExecutor (fork) in the same run, alternating, median of the per-repeat ratios
  (section 1's method, smaller);
- lateness: 250 jobs over 2.5 s (50 instants carrying 2 jobs) on 2 workers, ``at=`` epoch
  seconds, against stdlib ``sched`` in this process, alternating: p99 and p50 (section 2's
  method, smaller), and how many jobs started before their due time by the manager's
  monotonic clock (``stats().queue.started_early``) and by the wall clock (``time.time()`` in
  the job against ``at``);
- efficiency: 1,000 jobs of 2 ms of pure-Python CPU submitted at once on 2 workers, against
  ProcessPoolExecutor (fork), alternating: the jobs' own CPU ÷ 2 ÷ wall time (section 11's
  method, smaller); mpsched's may trail ProcessPoolExecutor's of the same round by at most
  ``EFFICIENCY_GAP`` (median over rounds; rounds with another tenant busy are run again).

A guard, not a measurement to quote: numbers the READMEs claim come from ``run.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p
)

from benchmarks import _common, bench_cpu, bench_lateness, bench_throughput  # noqa: E402
from benchmarks._common import (  # noqa: E402
    alternate,
    column,
    measured_package_root,
    median,
    percentiles,
    ratios,
    scheduler,
)
from benchmarks.jobs import calibrate_burn, noop, stamp_both  # noqa: E402

THROUGHPUT_TARGET = 1.5  # x ProcessPoolExecutor
P99_GAP_TARGET = 0.3  # ms over sched's p99
P50_GAP_TARGET = 0.3  # ms over sched's p50 (section 2's target)
LATENESS_PLAN = (250, 2.5, 50)  # jobs, span (s), instants carrying 2 jobs
EFFICIENCY_BATCH = (1_000, 2.0)  # jobs, ms of CPU each
# How far mpsched's efficiency may trail ProcessPoolExecutor's in the same round: 751f38f
# trails it by ~0.052 in quiet rounds, and by ~0.096 with 100 µs more manager CPU per job
# (benchmarks/README.md, section 11's run notes: "The guard").
EFFICIENCY_GAP = 0.08
QUIET_CORES = 0.15  # other processes' CPU above which an efficiency round is run again


def throughput(jobs: int, repeats: int) -> bool:
    results = alternate(
        [
            ("mpsched", lambda: bench_throughput.run_mpsched(jobs, 2)),
            ("ProcessPoolExecutor", lambda: bench_throughput.run_process_pool(jobs, 2)),
        ],
        repeats,
        "guard throughput",
    )
    ours, theirs = (
        column(results["mpsched"], "jobs_per_s"),
        column(results["ProcessPoolExecutor"], "jobs_per_s"),
    )
    ratio = median(ratios(ours, theirs))
    met = ratio >= THROUGHPUT_TARGET
    print(
        f"throughput: mpsched {ratio:.2f}x ProcessPoolExecutor ({median(ours):,.0f} vs "
        f"{median(theirs):,.0f} jobs/s; {jobs:,} no-op submits, 2 workers, median of "
        f"{repeats}; target >= {THROUGHPUT_TARGET}x) {'ok' if met else 'MISSED'}"
    )
    return met


def _mpsched_lateness(offsets: list[float]) -> dict[str, float]:
    with scheduler(workers=2) as s:
        for f in [s.submit(noop) for _ in range(8)]:
            f.result()
        early_before = s.stats().queue.started_early
        wall = time.time() - time.monotonic()
        first = time.monotonic() + bench_lateness._lead(len(offsets))
        dues = [first + o for o in offsets]
        ats = [due + wall for due in dues]
        futures = [s.schedule(stamp_both, at=at) for at in ats]
        stamps = [f.result() for f in futures]
        early = s.stats().queue.started_early - early_before
    late = [mono - due for (mono, _), due in zip(stamps, dues, strict=True)]
    result = {f"{k}": v * 1e3 for k, v in percentiles(late).items()}
    result["early_monotonic"] = float(early)
    result["early_wall"] = float(sum(1 for (_, w), at in zip(stamps, ats, strict=True) if w < at))
    return result


def _sched_lateness(offsets: list[float]) -> dict[str, float]:
    late, _ = bench_lateness.run_sched(offsets)
    return {k: v * 1e3 for k, v in percentiles(late).items()}


def lateness(repeats: int) -> bool:
    offsets = bench_lateness.plan(*LATENESS_PLAN)
    results = alternate(
        [
            ("mpsched", lambda: _mpsched_lateness(offsets)),
            ("sched", lambda: _sched_lateness(offsets)),
        ],
        repeats,
        "guard lateness",
    )
    mine, floor = results["mpsched"], results["sched"]
    ok = True
    for q, target in (("p99", P99_GAP_TARGET), ("p50", P50_GAP_TARGET)):
        gap = median([a - b for a, b in zip(column(mine, q), column(floor, q), strict=True)])
        met = gap <= target
        ok &= met
        print(
            f"lateness {q}: mpsched {median(column(mine, q)):.3f} ms, sched (in-process) "
            f"{median(column(floor, q)):.3f} ms, {gap:+.3f} ms ({LATENESS_PLAN[0]} jobs, "
            f"median of {repeats}; target: within {target} ms of sched's) "
            f"{'ok' if met else 'MISSED'}"
        )
    for clock in ("monotonic", "wall"):
        early = int(sum(column(mine, f"early_{clock}")))
        ok &= early == 0
        print(
            f"early starts by the {clock} clock: {early} of "
            f"{LATENESS_PLAN[0] * repeats} jobs (target 0) {'ok' if not early else 'MISSED'}"
        )
    return ok


def efficiency(repeats: int) -> bool:
    """Rounds of mpsched and ProcessPoolExecutor back to back, order swapped each round.

    A round in which other processes used more than ``QUIET_CORES`` during either run is
    run again, up to ``3 * repeats`` rounds in all: efficiency is wall time, which another
    tenant moves by ±0.2 here, several times the margin judged.
    """
    jobs, length_ms = EFFICIENCY_BATCH
    loops = calibrate_burn(length_ms / 1e3)
    contenders = [
        ("mpsched", lambda: bench_cpu.run_mpsched(jobs, loops)),
        ("ProcessPoolExecutor", lambda: bench_cpu.run_process_pool(jobs, loops)),
    ]
    quiet: list[tuple[_common.Result, _common.Result]] = []
    busy = 0
    for attempt in range(3 * repeats):
        if len(quiet) == repeats:
            break
        runs = alternate(contenders[::-1] if attempt % 2 else contenders, 1, "guard efficiency")
        pair = runs["mpsched"][0], runs["ProcessPoolExecutor"][0]
        if max(run["other_cores"] for run in pair) > QUIET_CORES:
            busy += 1
        else:
            quiet.append(pair)
    what = f"efficiency, {jobs:,} x {length_ms:g} ms at once"
    if not quiet:
        print(
            f"{what}: not judged, other processes used more than {QUIET_CORES} cores in "
            f"all {busy} rounds MISSED"
        )
        return False
    gap = median([ours["efficiency"] - theirs["efficiency"] for ours, theirs in quiet])
    met = gap >= -EFFICIENCY_GAP
    ours = median([p[0]["efficiency"] for p in quiet])
    theirs = median([p[1]["efficiency"] for p in quiet])
    cpu = median([p[0]["cpu_us_client"] + p[0]["cpu_us_manager"] for p in quiet])
    parent = median([p[1]["cpu_us_parent"] for p in quiet])
    print(
        f"{what}: mpsched {ours:.3f}, ProcessPoolExecutor {theirs:.3f}, {gap:+.3f} "
        f"(median of {len(quiet)} quiet of {len(quiet) + busy} rounds; client + manager "
        f"{cpu:.0f} µs per job, ProcessPoolExecutor's parent {parent:.0f}; target: at most "
        f"{EFFICIENCY_GAP} below ProcessPoolExecutor's) {'ok' if met else 'MISSED'}"
    )
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="throughput jobs per run")
    parser.add_argument("--verbose", action="store_true", help="log each repeat to stderr")
    args = parser.parse_args(argv)
    if not args.verbose:
        _common.log = lambda message: None  # alternate() logs each repeat through it
    os.chdir(measured_package_root())  # see benchmarks/README.md: the forkserver's path
    start = time.perf_counter()
    ok = throughput(args.jobs, args.repeats)
    ok &= lateness(args.repeats)
    ok &= efficiency(args.repeats)
    print(
        f"bench-guard: {'all targets met' if ok else 'a target was MISSED'} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
