"""Job functions of the workflow tests: importable by the workers."""

from __future__ import annotations

import os
import time
from typing import Any


def log_line(log_path: str, line: str) -> None:
    """One O_APPEND write: lines of concurrent jobs never interleave."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def step(log_path: str, name: str, *inputs: Any) -> tuple[str, ...]:
    """Log its start and end; return its name after its inputs' names."""
    log_line(log_path, f"start {name}")
    names: list[str] = []
    for value in inputs:
        names.extend(value if isinstance(value, tuple) else [repr(value)])
    log_line(log_path, f"end {name}")
    return (*names, name)


def square(log_path: str, name: str, base: int, i: int) -> int:
    log_line(log_path, f"start {name}")
    log_line(log_path, f"end {name}")
    return base + i * i


def total(log_path: str, name: str, values: list[int]) -> int:
    log_line(log_path, f"start {name}")
    log_line(log_path, f"end {name}")
    return sum(values)


def slow_step(log_path: str, name: str, seconds: float, *inputs: Any) -> tuple[str, ...]:
    log_line(log_path, f"start {name}")
    time.sleep(seconds)
    log_line(log_path, f"end {name}")
    return (*[n for v in inputs for n in v], name)


def fail(message: str) -> None:
    raise ValueError(message)


def describe(value: Any) -> str:
    """What a job received: an exception's type and text, or the value's repr."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return repr(value)


def starts(log_path: str) -> list[str]:
    """The names of the jobs that started, in order."""
    with open(log_path) as file:
        return [line.split()[1] for line in file if line.startswith("start ")]


def order(log_path: str) -> list[str]:
    with open(log_path) as file:
        return [line.strip() for line in file]


def layer(log_path: str, name: str, seconds: float, values: list[int]) -> int:
    """One job of a layered graph: 1 at the first layer, else the sum of its inputs."""
    log_line(log_path, f"start {name}")
    time.sleep(seconds)
    log_line(log_path, f"end {name}")
    return sum(values) if values else 1


def run_after(log_path: str, key: str, hold: float, *inputs: Any) -> list[str]:
    """Log this run as ``start key pid`` and its end as ``end key``; return the keys of
    its inputs (lists of keys), then its own."""
    log_line(log_path, f"start {key} {os.getpid()}")
    time.sleep(hold)
    log_line(log_path, f"end {key}")
    keys: list[str] = []
    for value in inputs:
        keys.extend(value)
    return [*keys, key]


def pids(log_path: str) -> dict[str, list[int]]:
    """The pids each job started in, by key."""
    found: dict[str, list[int]] = {}
    with open(log_path) as file:
        for line in file:
            if line.startswith("start "):
                _, key, pid = line.split()
                found.setdefault(key, []).append(int(pid))
    return found


def order_keys(log_path: str) -> list[str]:
    """The log's lines without pids: ``start key`` and ``end key``."""
    with open(log_path) as file:
        return [" ".join(line.split()[:2]) for line in file]


def big(size: int) -> bytes:
    """A result large enough to go through shared memory."""
    return b"x" * size


def length(data: bytes, more: list[bytes]) -> tuple[int, int]:
    return len(data), len(more[0])
