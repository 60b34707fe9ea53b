"""Job functions the benchmarks run, at module level so every peer can import them.

ProcessPoolExecutor, multiprocessing.Pool, loky and APScheduler pickle a function by
reference, so it must be importable as ``benchmarks.jobs.NAME`` in their workers; mpsched's
cloudpickle does the same for an importable module. ``run.py`` puts the repository root on
``sys.path`` and ``PYTHONPATH`` before any process starts.
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType


def noop() -> None:
    """The dispatch benchmark's job: all cost is the scheduler's."""


def stamp() -> float:
    """Return the moment the job started, on the machine-wide monotonic clock.

    On Linux ``time.monotonic()`` is CLOCK_MONOTONIC, shared by every process, so the
    value compares directly with a due instant computed in the benchmark process.
    """
    return time.monotonic()


def stamp_both() -> tuple[float, float]:
    """Return the moment the job started on the monotonic clock and on the wall clock."""
    return time.monotonic(), time.time()


def spin(loops: int) -> int:
    """Pure-Python CPU work that holds the GIL for its whole run (about 0.1 us a loop)."""
    total = 0
    for i in range(loops):
        total += i * i % 7
    return total


def burn(loops: int) -> tuple[float, float]:
    """Section 11's job: ``spin(loops)``; returns its start and the CPU it used itself.

    The start is ``time.time()`` (the wall clock ``at=`` and ``run_date`` are given in);
    the CPU is this thread's own (``time.thread_time()``, nanosecond resolution) over the
    ``spin`` alone, so a pool's unpickling, reporting or other threads never count in it.
    """
    started = time.time()
    cpu = time.thread_time()
    spin(loops)
    return started, time.thread_time() - cpu


def spin_then_stamp(loops: int) -> float:
    """``spin(loops)``, then the job's end on the wall clock (the result-latency job)."""
    spin(loops)
    return time.time()


def calibrate_burn(seconds: float, trials: int = 5) -> int:
    """How many ``spin`` loops take ``seconds`` of this thread's CPU.

    Timed on ``time.thread_time()``, not the wall clock: another tenant taking the core
    during a probe does not shrink the count, as it does ``calibrate_spin``'s. The fastest
    of ``trials`` runs counts: a busy sibling core or cache only slows a loop down, so a
    job takes at least ``seconds`` on a quiet core. Refined three times at the size found:
    a loop costs more once ``i * i`` outgrows one 30-bit digit.
    """
    loops = max(1, int(seconds * 1e7))  # ~0.1 µs a loop: a first guess
    for _ in range(3):
        fastest = float("inf")
        for _ in range(trials):
            start = time.thread_time()
            spin(loops)
            fastest = min(fastest, time.thread_time() - start)
        loops = max(1, round(loops * seconds / max(fastest, 1e-9)))
    return loops


def calibrate_spin(seconds: float, trials: int = 3) -> int:
    """How many ``spin`` loops take ``seconds`` in this process (median of ``trials``)."""
    probe = 200_000
    rates = []
    for _ in range(trials):
        start = time.perf_counter()
        spin(probe)
        rates.append(probe / (time.perf_counter() - start))
    rates.sort()
    return max(1, int(rates[len(rates) // 2] * seconds))


def bracketed(log_path: str, key: str, cpu_seconds: float) -> str:
    """The chaos benchmarks' job: write ``start KEY PID T``, burn ``cpu_seconds`` of CPU,
    write ``end KEY PID T`` (T the wall clock), one O_APPEND write each; return the key."""
    _append(log_path, f"start {key} {os.getpid()} {time.time()!r}\n")
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass
    _append(log_path, f"end {key} {os.getpid()} {time.time()!r}\n")
    return key


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def noop_arg(_item: object) -> None:
    """``noop`` for ``map``: one argument, ignored."""


def mpsched_location() -> str:
    """Where the worker running this imported mpsched from (checked once per run)."""
    import mpsched

    return str(mpsched.__file__)


def nbytes(data: object) -> int:
    """The payload benchmark's job: the size of its argument (bytes or a NumPy array)."""
    return int(getattr(data, "nbytes", None) or len(data))  # type: ignore[arg-type]


def make_bytes(size: int) -> bytes:
    """The payload benchmark's result job: ``size`` bytes back to the client."""
    return b"\x02" * size


def stamp_run(path: str) -> None:
    """Append this run's start (``time.monotonic()``) and its job id to the file ``path``.

    For the drift benchmark: a schedule's run does not get its own job id, so it is read
    from the mpsched worker's frame that called it (``assignment.lease.job_id``; the run id
    ``"{schedule}@{slot, UTC}"`` names the slot). Only after the stamp, so the lookup and
    the write do not count in the offset. One ``os.write`` of one short line per run:
    O_APPEND keeps the lines of two workers whole.
    """
    started = time.monotonic()
    frame: FrameType | None = sys._getframe(1)
    job_id = "?"
    while frame is not None:
        assignment = frame.f_locals.get("assignment")
        lease = getattr(assignment, "lease", None)
        if lease is not None:
            job_id = lease.job_id
            break
        frame = frame.f_back
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{started!r} {job_id}\n".encode())
    finally:
        os.close(fd)
