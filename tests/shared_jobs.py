"""Job functions for the tests of managers sharing a Redis store: each run leaves one line
in a log (``key start-wall-clock pid``, one O_APPEND write, so concurrent runs never
interleave and a log read after a SIGKILL holds every run that started)."""

from __future__ import annotations

import os
import time
from typing import NamedTuple


class Run(NamedTuple):
    key: str
    started: float  # wall clock, epoch seconds
    pid: int


def run(log_path: str, key: str, hold: float = 0.0) -> str:
    """Log this run, then sleep ``hold`` seconds; return the key."""
    line = f"{key} {time.time()!r} {os.getpid()}\n".encode()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(hold)
    return key


def gated(log_path: str, key: str, gate: str = "") -> str:
    """Log this run, then, with a ``gate``, wait until that file exists (30 s at most);
    return the key."""
    run(log_path, key)
    deadline = time.monotonic() + 30.0
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    return key


def whole_lines(log_path: str) -> list[str]:
    """The lines of a log that runs append to, without a half line at its end: a line
    that straddles a page is copied into the file a page at a time, and a reader may see
    the first page's part alone. Empty for a log not written yet."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as log:
        text = log.read()
    return text[: text.rfind("\n") + 1].splitlines()


def runs(log_path: str) -> list[Run]:
    """Every run logged, in log order (whole lines only)."""
    return [
        Run(k, float(s), int(p)) for k, s, p in (line.split() for line in whole_lines(log_path))
    ]


def gate(log_path: str, key: str, path: str, timeout: float = 30.0) -> str:
    """Log this run, then hold its worker until the file ``path`` exists (at most
    ``timeout`` seconds); return the key."""
    run(log_path, key)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return key
