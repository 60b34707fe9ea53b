"""Job functions of async jobs and of jobs that read their context: importable, so workers
unpickle them by reference."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


async def add(a: int, b: int) -> int:
    return a + b


async def sleep_then(seconds: float, value: Any) -> tuple[Any, float]:
    """Await asyncio.sleep; return ``value`` and the seconds it took."""
    started = time.monotonic()
    await asyncio.sleep(seconds)
    return value, time.monotonic() - started


async def fail_async(message: str) -> None:
    await asyncio.sleep(0)
    raise KeyError(message)


async def announce_then_sleep_async(fifo: str, seconds: float) -> str:
    with open(fifo, "w") as out:
        out.write(str(os.getpid()))
    await asyncio.sleep(seconds)
    return "woke"


async def loop_identity() -> tuple[int, int]:
    """(pid, id of the running loop): the same loop serves a worker's async jobs."""
    return os.getpid(), id(asyncio.get_running_loop())


def returns_awaitable(value: Any) -> Any:
    """A plain function that returns an awaitable: it is awaited too."""
    return asyncio.sleep(0, value)


def running_loop() -> bool:
    """Whether a plain job runs inside an event loop (it should not)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
