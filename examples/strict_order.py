"""Strict order on one worker: due time first, then priority, then submission order (FIFO).

To see strict time-then-priority order, drop to a single worker: with one consumer, jobs
are handed out in exact comparator order. This script submits 12
jobs in a scrambled order, due at three instants (+0.5 s, +0.8 s, +1.1 s) with mixed and
repeated priorities, to ``Scheduler(workers=1)``. It prints the order they ran in and
checks it against the order computed here from the ``order="time"`` key:
(due, priority level, submission number).

Equal due times must be exactly equal for the tie-breaks to show, so every job is given
as ``at=`` the same origin plus a fixed offset, not as a ``delay=`` from its own submission.

Run it: ``python examples/strict_order.py``
"""

from __future__ import annotations

import os
import random
import time
from typing import NamedTuple

from mpsched import Priority, Scheduler

HIGH, MEDIUM, LOW = Priority.HIGH, Priority.MEDIUM, Priority.LOW


class Planned(NamedTuple):
    """One job as this script plans it; ``number`` is its place in submission order."""

    number: int
    offset: float  # seconds after the origin
    priority: Priority


class Start(NamedTuple):
    """What a job returns: which job, on which worker, when it started."""

    number: int
    worker_pid: int
    started: float  # the worker's time.monotonic()


# (due offset, priority) of each job; shuffled below so the submission order is scrambled.
PLAN = [
    (0.5, HIGH),
    (0.5, HIGH),
    (0.5, MEDIUM),
    (0.5, LOW),
    (0.5, LOW),
    (0.8, LOW),
    (0.8, HIGH),
    (0.8, MEDIUM),
    (0.8, MEDIUM),
    (1.1, MEDIUM),
    (1.1, HIGH),
    (1.1, LOW),
]
SHUFFLE_SEED = 7  # any seed scrambles; a fixed one makes the output repeatable


def record_start(number: int) -> Start:
    """The job: say which one it is and when it started."""
    return Start(number, os.getpid(), time.monotonic())


def scrambled_plan() -> list[Planned]:
    """The jobs in the order they will be submitted, numbered 1, 2, ... in that order."""
    shuffled = list(PLAN)
    random.Random(SHUFFLE_SEED).shuffle(shuffled)
    return [Planned(n, offset, priority) for n, (offset, priority) in enumerate(shuffled, 1)]


def expected_order(plan: list[Planned]) -> list[int]:
    """Job numbers by the ``order="time"`` key: due, then priority level, then FIFO."""
    return [p.number for p in sorted(plan, key=lambda p: (p.offset, p.priority.level, p.number))]


def print_runs(starts: list[Start], plan: list[Planned], origin: float) -> None:
    by_number = {p.number: p for p in plan}
    print(" ran  job  due      priority  started")
    for position, start in enumerate(starts, 1):
        job = by_number[start.number]
        print(
            f"{position:4d}  #{job.number:<3d} +{job.offset:.1f} s   {job.priority.name:<8}"
            f"  +{start.started - origin:.3f} s"
        )


def main() -> int:
    plan = scrambled_plan()
    with Scheduler(workers=1) as s:
        origin, origin_epoch = time.monotonic(), time.time()
        futures = [
            s.schedule(record_start, p.number, at=origin_epoch + p.offset, priority=p.priority)
            for p in plan
        ]
        submit_ms = (time.monotonic() - origin) * 1000
        starts = sorted((f.result(timeout=30) for f in futures), key=lambda r: r.started)
    print(f"submitted {len(plan)} jobs in {submit_ms:.0f} ms, in this order:")
    print("  " + "  ".join(f"#{p.number} {p.priority.name} +{p.offset:.1f}s" for p in plan[:6]))
    print("  " + "  ".join(f"#{p.number} {p.priority.name} +{p.offset:.1f}s" for p in plan[6:]))
    print(
        f"one worker (pid {', '.join(str(p) for p in {r.worker_pid for r in starts})}) ran them:\n"
    )
    print_runs(starts, plan, origin)
    expected = expected_order(plan)
    actual = [r.number for r in starts]
    print(f"\nexpected (time → priority → FIFO): {' '.join(f'#{n}' for n in expected)}")
    print(f"actual:                            {' '.join(f'#{n}' for n in actual)}")
    if actual != expected:
        print("✗ the execution order differs from time → priority → FIFO")
        if submit_ms >= min(offset for offset, _ in PLAN) * 1000:
            print("  (submitting took longer than the first delay: late jobs were due at once)")
        return 1
    print("✓ exactly time → priority → FIFO")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
