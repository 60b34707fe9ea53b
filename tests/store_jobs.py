"""Job functions for the job-store tests: each run leaves one line in a log.

A line is ``key wall-clock-start``, written with one O_APPEND write, so lines of concurrent
runs never interleave and a log read after a SIGKILL holds every run that started.
"""

from __future__ import annotations

import os
import time


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


def read_log(log_path: str) -> dict[str, list[float]]:
    """The start times of each key's runs, in log order."""
    runs: dict[str, list[float]] = {}
    if not os.path.exists(log_path):
        return runs
    with open(log_path) as log:
        for line in log:
            key, started = line.split()
            runs.setdefault(key, []).append(float(started))
    return runs


def _log(log_path: str, key: str) -> None:
    line = f"{key} {time.time()!r}\n".encode()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _ran_before(log_path: str, key: str) -> bool:
    return key in read_log(log_path)
