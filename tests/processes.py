"""Helpers for tests that watch real processes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    """Poll a state the processes under test offer no event for."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.05)


def wait_started(fifo: str) -> list[int]:
    """Block until a job announces itself on ``fifo`` (tests/jobs.py); returns its pids."""
    with open(fifo) as announced:
        return [int(x) for x in announced.read().split()]


def assert_gone(procs: Iterable[int | psutil.Process], timeout: float = 15.0) -> None:
    """Every process exits within ``timeout`` (a zombie awaiting its reaper counts)."""
    watched = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            watched.append(proc if isinstance(proc, psutil.Process) else psutil.Process(proc))
    _, alive = psutil.wait_procs(watched, timeout=timeout)
    running = [p for p in alive if _running(p)]
    assert not running, f"left behind: {running}"


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
