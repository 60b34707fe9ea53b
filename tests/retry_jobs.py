"""Job functions of the retry tests: each appends one line per run to a log (one O_APPEND
write), so a test counts runs and reads their start times whatever process ran them."""

from __future__ import annotations

import os
import time

from mpsched import RetryLater


class Flaky(Exception):
    """A failure a policy may list."""


class Fatal(Exception):
    """A failure a policy may list in ``never``."""


def log_start(log_path: str) -> int:
    """Append this run's start (monotonic clock, which local workers share) and its pid;
    return how many runs the log held before."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{time.monotonic()!r} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return len(starts(log_path)) - 1


def starts(log_path: str) -> list[float]:
    """The starts a log holds, in order."""
    if not os.path.exists(log_path):
        return []
    return [started for started, _ in runs(log_path)]


def runs(log_path: str) -> list[tuple[float, int]]:
    """Each run a log holds, in order: its start and the pid of its worker."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return [(float(start), int(pid)) for start, pid in map(str.split, f)]


def always_fail(log_path: str, message: str = "boom") -> None:
    run = log_start(log_path)
    raise ValueError(f"{message} {run + 1}")


def fail_times(log_path: str, failures: int, result: str = "ok") -> str:
    """Raise Flaky on the first ``failures`` runs, then return ``result``."""
    run = log_start(log_path)
    if run < failures:
        raise Flaky(f"run {run + 1}")
    return result


def raise_named(log_path: str, name: str) -> None:
    """Raise the exception ``name``: Flaky, Fatal, KeyError, KeyboardInterrupt, SystemExit."""
    log_start(log_path)
    errors: dict[str, BaseException] = {
        "Flaky": Flaky("flaky"),
        "Fatal": Fatal("fatal"),
        "KeyError": KeyError("k"),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "SystemExit": SystemExit(3),
    }
    raise errors[name]


def later(log_path: str, delay: float, reason: str | None = None, times: int = 99) -> int:
    """Raise RetryLater on the first ``times`` runs; then return the run's number."""
    run = log_start(log_path)
    if run < times:
        raise RetryLater(delay, reason)
    return run + 1


def crash_first(log_path: str) -> str:
    """The first run's worker dies; later runs raise Flaky."""
    run = log_start(log_path)
    if run == 0:
        os._exit(7)
    raise Flaky(f"run {run + 1}")


def slow_fail(log_path: str, seconds: float) -> None:
    """Log the start, work ``seconds``, then raise ValueError."""
    run = log_start(log_path)
    time.sleep(seconds)
    raise ValueError(f"slow {run + 1}")


def notes(error: BaseException | None) -> list[str]:
    """The notes an exception carries (``__notes__``, which Python 3.10 does not declare)."""
    return list(getattr(error, "__notes__", []))
