"""Job functions for the job-store tests: each run leaves lines in a log.

A line is ``key wall-clock-start`` (``bracketed`` writes ``start KEY`` and ``end KEY``
instead, to a log of its own), written with one O_APPEND write, so lines of concurrent
runs never interleave and a log read after a SIGKILL holds every run that started.
"""

from __future__ import annotations

import os
import signal
import time

from shared_jobs import whole_lines


def record_at(log_path: str, key: str) -> str:
    """Log this run's key and wall-clock start time (epoch seconds); return the key."""
    _log(log_path, key)
    return key


def hold(log_path: str, key: str, first: float, again: float) -> str:
    """Log this run, then sleep ``first`` seconds, or ``again`` when the log already holds
    a run of ``key`` (this is a retry); return the key."""
    rerun = _ran_before(log_path, key)
    _log(log_path, key)
    time.sleep(again if rerun else first)
    return key


def bracketed(log_path: str, key: str, cpu_seconds: float) -> str:
    """Log ``start KEY``, burn ``cpu_seconds`` of CPU, log ``end KEY``; return the key."""
    _write(log_path, f"start {key}\n")
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass
    _write(log_path, f"end {key}\n")
    return key


def stop_manager_then_sleep(log_path: str, key: str, manager_pid: int, fifo: str) -> str:
    """Log ``start KEY``, SIGSTOP the manager (so that nothing more reaches it), tell the
    test on ``fifo``, then sleep for a minute: the test kills the processes meanwhile."""
    _write(log_path, f"start {key}\n")
    os.kill(manager_pid, signal.SIGSTOP)
    with open(fifo, "w") as out:
        out.write(str(os.getpid()))
    time.sleep(60)
    return key


def read_log(log_path: str) -> dict[str, list[float]]:
    """The start times of each key's runs, in log order."""
    runs: dict[str, list[float]] = {}
    for line in whole_lines(log_path):
        key, started = line.split()
        runs.setdefault(key, []).append(float(started))
    return runs


def _log(log_path: str, key: str) -> None:
    _write(log_path, f"{key} {time.time()!r}\n")


def _write(log_path: str, line: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _ran_before(log_path: str, key: str) -> bool:
    return key in read_log(log_path)
