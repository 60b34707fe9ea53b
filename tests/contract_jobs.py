"""Jobs for test_executor_contract.py: importable, so workers unpickle them by reference.

CPython's executor tests block jobs on a multiprocessing Event. Here a *gate* does that
without another process: a named pipe plus a flag file beside it. ``open_gate`` (called
by the test) creates the flag, then writes to the pipe, which wakes every job blocked in
``wait_gate``; a job that reaches the gate later sees the flag. Each job opens the pipe
before it looks for the flag, so no opening is missed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

GATE_LIMIT = 60.0  # a job never waits longer than this, whatever the test does


def wait_gate(gate: str, limit: float = GATE_LIMIT) -> bool:
    """Block until ``open_gate(gate)``; False if ``limit`` seconds passed first."""
    fd = os.open(gate, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if os.path.exists(gate + ".open"):
            return True
        readable, _, _ = select.select([fd], [], [], limit)
        return bool(readable)
    finally:
        os.close(fd)


def open_gate(gate: str) -> None:
    """Let every job waiting at ``gate`` go on, and every later one pass at once."""
    Path(gate + ".open").touch()
    try:
        fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no job is waiting at the gate right now
            return
        raise
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


def say(fifo: str, message: Any) -> None:
    """Write one line to ``fifo`` if a test is reading it; never blocks."""
    with contextlib.suppress(OSError):  # no reader (ENXIO) or it left (EPIPE)
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"{message}\n".encode())
        finally:
            os.close(fd)


def pause(gate: str | None) -> None:
    """Return at once, or once ``gate`` opens: a map() item that may block."""
    if gate is not None:
        wait_gate(gate)


def wait_gate_and_raise(gate: str) -> None:
    wait_gate(gate)
    raise Exception("this is an exception")


def report_wait_return(fifo: str, gate: str, value: Any) -> Any:
    """Say on ``fifo`` that we started, wait for ``gate``, return ``value``."""
    say(fifo, value)
    wait_gate(gate)
    return value


def report_then_sleep(fifo: str, value: Any, seconds: float) -> Any:
    say(fifo, value)
    time.sleep(seconds)
    return value


def mul(x: Any, y: Any) -> Any:
    return x * y


def capture(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return args, kwargs


class MyObject:
    def my_method(self) -> None:
        pass


def make_dummy_object(_: Any) -> MyObject:
    return MyObject()


def raise_runtime_error() -> None:
    raise RuntimeError(123)  # some comment


class DelSignal:
    """Says on ``fifo`` which process dropped its copy of this object."""

    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    def __del__(self) -> None:
        say(self.fifo, os.getpid())


class EventfulGCObj:
    """CPython's: sets an Event of a multiprocessing.Manager when a copy is dropped."""

    def __init__(self, mgr: Any) -> None:
        self.event = mgr.Event()

    def __del__(self) -> None:
        self.event.set()


def sleep_and_print(seconds: float, message: str) -> None:
    time.sleep(seconds)
    print(message)
    sys.stdout.flush()


def report_sleep_print(fifo: str, seconds: float, message: str) -> None:
    say(fifo, "started")
    sleep_and_print(seconds, message)


def good_task(n: int) -> int:
    time.sleep(0.1 * n)
    return n


def failing_task(n: int) -> int:
    raise ValueError("failing task")
