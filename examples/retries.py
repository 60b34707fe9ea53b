"""Retries: jobs that call a flaky service run again with back-off, and nothing more.

Eight downloads call a service that fails each one's first two calls with a connection
error, and rate-limits one of them, which then asks to run later (RetryLater). Each job has
a policy of 3 retries, 0.1 s back-off doubling, so all eight succeed; a ninth, whose
address is refused for good, fails after its 4 runs, its exception listing each earlier
attempt as a note. Every run is logged (one O_APPEND line each), so the end checks that
each job ran exactly as often as it had to.

Run it: ``python examples/retries.py``
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter

from mpsched import RetryLater, RetryPolicy, Scheduler

POLICY = RetryPolicy(3, backoff=0.1, never=(PermissionError,))


def download(log: str, name: str) -> str:
    """A job: log this run, then fail the first two runs of each name."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)
    with open(log) as f:
        run = f.read().split().count(name)
    if name == "refused":
        raise ConnectionRefusedError(f"{name}: connection refused (run {run})")
    if run <= 2:
        raise ConnectionResetError(f"{name}: connection reset (run {run})")
    if name == "page-3" and run == 3:
        raise RetryLater(0.2, "rate limited: 429 Too Many Requests")
    return f"{name}: 200 OK after {run} runs"


def main() -> None:
    log = os.path.join(tempfile.mkdtemp(prefix="retries-"), "runs.log")
    started = time.monotonic()
    with Scheduler(workers=2) as s:
        pages = [s.schedule(download, log, f"page-{n}", retry=POLICY) for n in range(8)]
        refused = s.schedule(download, log, "refused", retry=POLICY)
        for future in pages:
            print(future.result())
        error = refused.exception()
        print(f"refused: {type(error).__name__}: {error}")
        for note in getattr(error, "__notes__", []):
            print(f"  {note}")
        stats = s.stats().queue
    print(
        f"{time.monotonic() - started:.1f} s; runs again: {stats.retried_exception} after "
        f"an exception, {stats.retried_later} asked for (RetryLater)"
    )
    with open(log) as f:
        runs = Counter(f.read().split())
    expected = {f"page-{n}": 4 if n == 3 else 3 for n in range(8)} | {"refused": 4}
    assert runs == expected, runs
    print("✓ every job ran exactly as often as it had to, and no more")


if __name__ == "__main__":
    main()
