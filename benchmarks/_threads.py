"""Per-thread CPU and context switches from /proc, in nanoseconds, for sections that need
more than psutil's 10 ms ticks: section 11 and ``cpu_where.py``.

``/proc/PID/task/TID/schedstat`` counts the nanoseconds a thread has been on a CPU;
``/proc/PID/task/TID/status`` counts its voluntary and involuntary context switches. A
thread that exits between two readings takes its counts with it: whole processes are
read from their process CPU clock instead (:func:`process_cpu_seconds`), which keeps them.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ThreadCounts:
    """One thread's counters at one instant."""

    cpu_ns: int
    voluntary: int  # context switches it asked for: a blocking wait, a sleep
    involuntary: int  # context switches it suffered: preempted at the end of its slice


def thread_counts(pid: int) -> dict[int, ThreadCounts]:
    """Every live thread of ``pid``, by tid (empty when the process is gone)."""
    counts: dict[int, ThreadCounts] = {}
    try:
        tids = [int(entry.name) for entry in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return counts
    for tid in tids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            counts[tid] = _read(pid, tid)
    return counts


def _read(pid: int, tid: int) -> ThreadCounts:
    task = Path(f"/proc/{pid}/task/{tid}")
    cpu_ns = int((task / "schedstat").read_text().split()[0])
    switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    for line in (task / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in switches:
            switches[key] = int(value)
    return ThreadCounts(
        cpu_ns, switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"]
    )


def difference(
    before: dict[int, ThreadCounts], after: dict[int, ThreadCounts]
) -> dict[int, ThreadCounts]:
    """What each thread alive at ``after`` did since ``before`` (new threads from zero)."""
    zero = ThreadCounts(0, 0, 0)
    return {
        tid: ThreadCounts(
            now.cpu_ns - before.get(tid, zero).cpu_ns,
            now.voluntary - before.get(tid, zero).voluntary,
            now.involuntary - before.get(tid, zero).involuntary,
        )
        for tid, now in after.items()
    }


def process_cpu_seconds(pid: int) -> float | None:
    """All CPU ``pid`` has used, threads gone included, in ns resolution (None: gone).

    Linux's process CPU clock (what ``clock_getcpuclockid(3)`` returns for a pid, built by
    hand: Python has no binding for it). It sums every thread's nanoseconds on a CPU, as
    schedstat does, and keeps those of threads that have exited, which schedstat loses.
    """
    clock = ctypes.c_int32((~pid << 3) | 2).value  # CPUCLOCK_SCHED of the whole process
    try:
        return time.clock_gettime(clock)
    except OSError:
        return None


class ProcessMeter:
    """CPU seconds a set of processes used since the last :meth:`read` (or creation).

    A process that is gone by a reading counts what it had used until the one before.
    """

    def __init__(self, procs: Sequence[psutil.Process]) -> None:
        self._last = {proc.pid: process_cpu_seconds(proc.pid) or 0.0 for proc in procs}

    def read(self) -> float:
        """CPU seconds of all the processes since the previous reading."""
        total = 0.0
        for pid, before in self._last.items():
            now = process_cpu_seconds(pid)
            if now is None:
                continue
            total += now - before
            self._last[pid] = now
        return total
