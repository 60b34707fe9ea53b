"""Durable jobs: a program schedules work, is killed, and a new one finishes it.

A first program (this file run with ``--first``) opens a Scheduler on a SQLite store,
schedules six reports due in 1.5 s, each with an idempotency key, prints their job ids and
waits. This script kills it with SIGKILL before any report is due: its manager stops with
it. Then it opens a Scheduler on the same store, as a restarted service would. The six
pending jobs come back with their due times and run exactly once; scheduling the same
reports again, by key, queues nothing new; and each report's outcome is fetched by the job
id the first program printed.

Run it: ``python examples/durable_jobs.py``
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpsched import Scheduler, StoreLockedError

REPORTS = ["sales", "stock", "payroll", "returns", "leads", "churn"]


def write_report(log: str, name: str) -> str:
    """A job: append one line to ``log`` (one O_APPEND write per run)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)
    return f"{name} report written"


def first_program(store: str, log: str) -> None:
    s = Scheduler(workers=1, store=store)
    due = time.time() + 1.5
    for name in REPORTS:
        future = s.schedule(write_report, log, name, at=due, key=f"report-{name}")
        print(future.job_id, flush=True)
    s.stats()  # every submit is committed to the store
    print("ready", flush=True)
    time.sleep(60)  # killed long before this ends


def open_again(store: str) -> Scheduler:
    """The killed program's manager lets go of the store a moment after it dies."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return Scheduler(workers=2, store=store)
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        store, log = str(Path(tmp) / "jobs.db"), str(Path(tmp) / "reports.log")
        # Its manager logs that its owner is gone, as it should: not shown here.
        first = subprocess.Popen(
            [sys.executable, __file__, "--first", store, log],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert first.stdout is not None
        job_ids = [line.strip() for line in iter(first.stdout.readline, "ready\n")]
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        ran_before = Path(log).read_text().split() if Path(log).exists() else []
        print(f"first program: scheduled {len(job_ids)} reports, then was killed (SIGKILL)")

        with open_again(store) as s:
            # Due 1.5 s after they were scheduled: on a busy machine some may already be
            # running again by now, so count the first program's jobs in any state.
            recovered = [j for j in s.jobs() if j.job_id in job_ids]
            print(f"new program:   {len(recovered)} jobs recovered from the store")
            again = [s.schedule(write_report, log, name, key=f"report-{name}") for name in REPORTS]
            same = [f.job_id for f in again] == job_ids
            print(f"               scheduling them again by key gives the same jobs: {same}")
            results = [s.job(job_id).result(timeout=30) for job_id in job_ids]
            for job_id, result in zip(job_ids, results, strict=True):
                print(f"  {job_id}  {result}")
        runs = Path(log).read_text().split()
        ok = (
            same
            and not ran_before
            and len(recovered) == len(REPORTS)
            and sorted(runs) == sorted(REPORTS)
        )
        print(("✓" if ok else "✗") + " every report ran exactly once, after the restart")
        return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first"]:
        first_program(sys.argv[2], sys.argv[3])
        raise SystemExit(0)
    raise SystemExit(main())
