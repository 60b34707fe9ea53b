"""Recurring jobs: a fixed-rate schedule that does not drift, a slow one that never overlaps
itself, and a cron schedule's next runs across a DST change.

- ``every(0.2, ...)`` runs a cheap job at start + k * 0.2 s; each run reports when it
  started, and the offsets from the plan stay flat instead of growing.
- ``every(0.1, ...)`` with a job that takes 0.25 s: with ``overlap="skip"`` (the default)
  slots that come while a run is under way are skipped and counted, never run on top.
- ``cron("30 2 * * *", tz="Europe/Berlin")`` previews its next three runs, in Berlin
  time (nothing runs: the example ends long before 02:30).

Run it: ``python examples/recurring.py``
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from datetime import datetime

from mpsched import Scheduler


def started() -> float:
    """A job: when it started, on the system-wide monotonic clock."""
    return time.monotonic()


def slow_step(seconds: float) -> tuple[float, float]:
    start = time.monotonic()
    time.sleep(seconds)
    return start, time.monotonic()


def planned(run_id: str) -> float:
    """The wall-clock slot a run's id names (``id@2026-12-03T08:00:00.200000Z``)."""
    return datetime.fromisoformat(run_id.rpartition("@")[2].replace("Z", "+00:00")).timestamp()


def main() -> None:
    with Scheduler(workers=2) as s:
        offset = time.monotonic() - time.time()
        tick = s.every(0.2, started, id="tick", start=0.3)
        slow = s.every(0.1, slow_step, 0.25, id="slow", start=0.3)
        nightly = s.cron("30 2 * * *", started, tz="Europe/Berlin", id="nightly")
        while tick.counters.runs < 10:
            time.sleep(0.05)
        runs = tick.runs(10)
        steps = slow.runs(10)
        skipped = slow.counters.skipped
        tick.cancel()
        slow.cancel()  # the run each had armed ends cancelled; a running one finishes
        concurrent.futures.wait([*runs, *steps], timeout=30)
        print("run                                  late by")
        lateness = []
        for future in runs:
            if future.cancelled():
                continue
            late = future.result() - (planned(future.job_id) + offset)
            lateness.append(late)
            print(f"{future.job_id:36} {late * 1000:6.2f} ms")
        spans = sorted(f.result() for f in steps if not f.cancelled())
        overlaps = sum(b[0] < a[1] for a, b in itertools.pairwise(spans))
        print(
            f"slow schedule: {len(spans)} runs of 0.25 s every 0.1 s, {overlaps} overlaps, "
            f"{skipped} slots skipped"
        )
        preview = [t.strftime("%a %d %b %H:%M %Z") for t in nightly.preview(3)]
        print("nightly 02:30 in Berlin:", ", ".join(preview))
        ok = all(-0.003 < late < 0.1 for late in lateness) and overlaps == 0 and skipped > 0
        print("✓ on its slots, no drift, no overlap" if ok else "✗ unexpected timing")
        nightly.cancel()


if __name__ == "__main__":
    main()
