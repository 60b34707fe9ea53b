"""Where the lateness of a fixed-rate schedule's runs comes from, step by step.

    python -m benchmarks.profile_recurring [--runs 1000] [--interval 0.01] [--rounds 3]

Runs ``every(interval, stamp_run, ...)`` on 2 workers, as section 9 of the benchmarks does,
with probes patched into the manager and the workers (nothing in mpsched/ changes): what
the Scheduler's manager process runs is wrapped so that, in the manager,
``RunPlanner._arm_locked`` (a run is queued), ``JobQueue.take_batch`` (the heap handed a
run to a taker), ``ManagerService.take`` (the reply is about to be sent) and
``Endings.complete_all`` (a run's report arrived, and after it was handled) append a line
with ``time.monotonic()`` to a file, and the workers it starts do the same around
``_take`` (the reply arrived, in ``mpsched._worker.loop``) and ``_wait_until`` (the sleep to
the due instant of an early hand-off, in ``mpsched._worker.run``). Each run's due instant
is the manager's own (``Assignment.due``), so its offset is measured on the manager's
timeline.

Every probe costs a few microseconds per run (one ``os.write``); the offsets are a little
higher than the benchmark's, and they are only compared with each other.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from functools import wraps
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpsched._core.job import Assignment
    from mpsched._core.queue import JobQueue
    from mpsched._manager.endings import Endings
    from mpsched._manager.schedule_entry import ScheduleEntry
    from mpsched._manager.schedule_runs import RunPlanner
    from mpsched._manager.service import ManagerService
    from mpsched._protocol.codec import AssignmentWire
    from mpsched._protocol.records import Report
    from mpsched._worker.claims import ClaimSlot
    from mpsched._worker.process import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p
)

PROBES = "MPSCHED_DRIFT_PROBES"  # the file every probe appends to (inherited environment)


def _note(kind: str, job_id: str, *values: float) -> None:
    line = " ".join([kind, f"{time.monotonic()!r}", job_id, *map(repr, values)]) + "\n"
    fd = os.open(os.environ[PROBES], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def manager_with_probes(control: Connection) -> int:
    """What the manager process runs: install the probes, then run the real manager."""
    from mpsched._core import queue as _queue
    from mpsched._core.recurring import run_id
    from mpsched._manager import endings as _endings
    from mpsched._manager import schedule_runs as _schedule_runs
    from mpsched._manager import service as _service
    from mpsched._manager import supervisor as _supervisor
    from mpsched._protocol.codec import assignment_from_wire

    take_batch = _queue.JobQueue.take_batch

    @wraps(take_batch)
    def queue_take_batch(self: JobQueue, *a: Any, **k: Any) -> list[Assignment]:
        batch = take_batch(self, *a, **k)
        for got in batch:
            _note("heap", got.lease.job_id, got.due or 0.0)
        return batch

    serve_take = _service.ManagerService.take

    @wraps(serve_take)
    def service_take(self: ManagerService, *a: Any, **k: Any) -> list[AssignmentWire]:
        batch = serve_take(self, *a, **k)
        for wire in batch:
            _note("reply", assignment_from_wire(wire).lease.job_id)
        return batch

    complete_all = _endings.Endings.complete_all

    @wraps(complete_all)
    def endings_complete_all(self: Endings, reports: list[Report], *a: Any, **k: Any) -> int:
        for report in reports:
            _note("report", report.outcome.job_id, report.outcome.started or 0.0)
        ended = complete_all(self, reports, *a, **k)
        for report in reports:
            _note("rearmed", report.outcome.job_id)
        return ended

    arm = _schedule_runs.RunPlanner._arm_locked

    @wraps(arm)
    def arm_locked(self: RunPlanner, entry: ScheduleEntry, label: float) -> bool:
        armed = arm(self, entry, label)
        if armed:
            _note("arm", run_id(entry.spec.schedule_id, label), self.due(entry, label))
        return armed

    # Probes replace the methods on their classes: what mypy refuses by default.
    _queue.JobQueue.take_batch = queue_take_batch  # type: ignore[method-assign]
    _service.ManagerService.take = service_take  # type: ignore[method-assign]
    _endings.Endings.complete_all = endings_complete_all  # type: ignore[method-assign]
    _schedule_runs.RunPlanner._arm_locked = arm_locked  # type: ignore[method-assign]
    # The name the supervisor starts its workers with (imported there, not re-exported).
    _supervisor.worker_main = worker_with_probes  # type: ignore[attr-defined]
    from mpsched._manager.main import run_owned

    return run_owned(control)


def worker_with_probes(
    config: WorkerConfig, slot: ClaimSlot | None = None, lifeline: Connection | None = None
) -> None:
    """A worker process's target: probes around the take and the wait, then the real one."""
    from mpsched._worker import loop as _loop
    from mpsched._worker import run as _run

    take = _loop._take

    @wraps(take)
    def probed_take(*a: Any, **k: Any) -> list[Assignment]:
        batch = take(*a, **k)
        for got in batch:
            _note("arrived", got.lease.job_id, got.due if got.due is not None else 0.0)
        return batch

    wait_until = _run._wait_until

    def probed_wait(due: float) -> float:
        _note("sleep", "-", due)
        return wait_until(due)

    _loop._take = probed_take
    _run._wait_until = probed_wait
    _loop.worker_main(config, slot, lifeline)


def one_round(runs: int, interval: float, probes: str, records: str) -> None:
    from benchmarks._common import scheduler
    from benchmarks.jobs import noop, stamp_run
    from mpsched._manager import launcher as _manager_launcher

    _manager_launcher.ENTRY = ("benchmarks.profile_recurring", "manager_with_probes")
    with scheduler(workers=2) as s:
        for f in [s.submit(noop) for _ in range(8)]:
            f.result()
        Path(probes).write_text("")
        start = round(time.time() + 0.5, 3)
        schedule = s.every(interval, stamp_run, records, start=start, id="probe")
        time.sleep(0.5 + runs * interval + 0.1)
        schedule.cancel()


def analyse(probes: str, records: str) -> None:
    ev: dict[str, dict[str, list[float]]] = collections.defaultdict(dict)
    sleeps: list[tuple[float, float]] = []
    for line in Path(probes).read_text().splitlines():
        kind, t, job, *values = line.split()
        if kind == "sleep":
            sleeps.append((float(t), float(values[0])))
            continue
        ev[job][kind] = [float(t), *map(float, values)]
    for line in Path(records).read_text().splitlines():
        t, _, job = line.partition(" ")
        ev[job]["stamp"] = [float(t)]
    rows: list[dict[str, float]] = []
    for e in ev.values():
        if not {"arm", "heap", "arrived", "stamp"} <= e.keys():
            continue
        due = e["arm"][1]
        rows.append(
            {
                "offset": e["stamp"][0] - due,
                "armed_ahead": due - e["arm"][0],
                "heap_vs_handoff": e["heap"][0] - (due - 0.002),
                "heap_to_reply": e["reply"][0] - e["heap"][0] if "reply" in e else float("nan"),
                "reply_to_arrived": e["arrived"][0] - e["reply"][0]
                if "reply" in e
                else float("nan"),
                "arrived_vs_due": e["arrived"][0] - due,
                "entered_vs_due": (e["report"][1] - due) if "report" in e else float("nan"),
                "report_to_rearmed": (e["rearmed"][0] - e["report"][0])
                if "rearmed" in e
                else float("nan"),
            }
        )
    print(f"{len(rows)} runs matched")
    late = [r for r in rows if r["offset"] > 0.5e-3]
    for name in rows[0]:
        ms = sorted(r[name] * 1e3 for r in rows)
        n = len(ms)
        print(
            f"  {name:18s} p50 {ms[n // 2]:8.3f}  p90 {ms[int(n * 0.9)]:8.3f}  "
            f"p99 {ms[int(n * 0.99)]:8.3f}  max {ms[-1]:8.3f} ms"
        )
    print(f"{len(late)} runs later than 0.5 ms:")
    causes: collections.Counter[str] = collections.Counter()
    for r in late:
        if r["arrived_vs_due"] > 0:
            causes["hand-off arrived after due"] += 1
            if r["heap_vs_handoff"] > 0.002:
                causes["  of which: heap woke > due"] += 1
        else:
            causes["arrived early; late after the worker's sleep"] += 1
    for cause, n in causes.items():
        print(f"  {cause}: {n}")
    for r in sorted(late, key=lambda r: -r["offset"])[:10]:
        print("   " + "  ".join(f"{k}={v * 1e3:.3f}" for k, v in r.items()))
    if late:
        print(
            "  late runs, medians: "
            + ", ".join(f"{k} {statistics.median(r[k] for r in late) * 1e3:.3f}" for k in late[0])
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    from benchmarks._common import measured_package_root

    os.chdir(measured_package_root())
    with tempfile.TemporaryDirectory(prefix="mpsched-drift-probes-") as tmp:
        # One file for every round: the forkserver keeps the environment it started with.
        probes = os.environ[PROBES] = os.path.join(tmp, "probes")
        for r in range(args.rounds):
            records = os.path.join(tmp, f"runs{r}")
            one_round(args.runs, args.interval, probes, records)
            print(f"--- round {r + 1}, load {os.getloadavg()[0]:.2f}")
            analyse(probes, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
