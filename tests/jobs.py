"""Job functions used across processes: importable, so workers unpickle them by reference."""

from __future__ import annotations

import os
import random
import time
from typing import Any


def stamp(tag: Any = None) -> tuple[Any, int, float]:
    """Return (tag, worker pid, monotonic start time)."""
    return tag, os.getpid(), time.monotonic()


def burn(cpu_seconds: float) -> tuple[int, float, float, float]:
    """Spin for ``cpu_seconds`` of this process's CPU time; return (pid, start, end, cpu)."""
    start_wall = time.monotonic()
    start_cpu = time.process_time()
    while time.process_time() - start_cpu < cpu_seconds:
        sum(range(1000))
    return os.getpid(), start_wall, time.monotonic(), time.process_time() - start_cpu


def fail(message: str) -> None:
    raise ValueError(message)


def record(log_path: str, key: str, pad: bytes = b"") -> tuple[str, float]:
    """Append ``key`` to a log (one O_APPEND write per run) and return (key, start).

    ``pad`` only makes the job bigger on the wire."""
    started = time.monotonic()
    append_line(log_path, key)
    return key, started


def append_line(log_path: str, line: str) -> None:
    """One O_APPEND write of ``line``: lines of concurrent jobs never interleave."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def produce(
    address: Any, authkey: bytes, producer: int, count: int, log_path: str, horizon: float
) -> dict[str, Any]:
    """A producer process: submit ``count`` jobs with random due times and priorities.

    Returns how many ran, how many started before their due time, and which keys.
    """
    from mpsched import Priority, connect

    rng = random.Random(producer)
    client = connect(address, authkey=authkey)
    futures = []
    try:
        for i in range(count):
            delay = rng.uniform(0, horizon)
            priority = rng.choice(list(Priority))
            earliest = time.monotonic() + delay
            key = f"p{producer}-{i}"
            futures.append(
                (earliest, client.schedule(record, log_path, key, delay=delay, priority=priority))
            )
        keys, early = [], 0
        for earliest, future in futures:
            key, started = future.result(timeout=120)
            keys.append(key)
            early += started < earliest
        return {"keys": keys, "early": early}
    finally:
        client.shutdown(wait=False, cancel_futures=True)


def announce(fifo: str) -> None:
    """Tell the test (blocked reading ``fifo``) this job started, and in which pid."""
    with open(fifo, "w") as out:
        out.write(str(os.getpid()))


def announce_then_sleep(fifo: str, seconds: float, child: bool = False) -> str:
    """Announce, optionally start a child process, then sleep; announces "pid child_pid"."""
    import subprocess

    extra = ""
    if child:
        proc = subprocess.Popen(["sleep", str(seconds)])
        extra = f" {proc.pid}"
    with open(fifo, "w") as out:
        out.write(f"{os.getpid()}{extra}")
    time.sleep(seconds)
    return "woke"


def announce_then_wait(fifo: str, release: str, timeout: float) -> str:
    """Announce, then run until the file ``release`` exists (at most ``timeout`` s)."""
    with open(fifo, "w") as out:
        out.write(f"{os.getpid()}")
    deadline = time.monotonic() + timeout
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "woke"


def record_once_released(log_path: str, key: str, release: str, timeout: float) -> str:
    """Wait until the file ``release`` exists (at most ``timeout`` s), then record ``key``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    append_line(log_path, key)
    return key


def die_once(marker: str) -> str:
    """SIGKILL our own worker the first time; succeed the next."""
    import signal

    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def exit_process(code: int) -> None:
    os._exit(code)


def call_sys_exit(code: int) -> None:
    import sys

    sys.exit(code)


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def unpicklable_result() -> Any:
    import threading

    return threading.Lock()


def explode(*args: Any) -> Any:
    raise RuntimeError("this object refuses to be unpickled")


class LoadsBadly:
    """Pickles fine; unpickling it raises (the callable runs at load time)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (explode, ())


def return_loads_badly() -> LoadsBadly:
    return LoadsBadly()


def noop(x: Any = None) -> Any:
    return x


_HOARD: list[bytes] = []


def hoard(megabytes: int) -> int:
    """Keep ``megabytes`` alive in this worker; return its pid."""
    _HOARD.append(b"x" * (megabytes << 20))
    return os.getpid()


def pid() -> int:
    return os.getpid()


def getenv(name: str) -> str | None:
    """The worker's own environment variable ``name``."""
    return os.environ.get(name)


def record_then_sleep(log_path: str, key: str, fifo: str, seconds: float) -> str:
    """Log one line ``key``, announce on ``fifo`` (first run only: the fifo is read once),
    then sleep: a job that is running when its manager is killed."""
    record(log_path, key)
    if not os.path.exists(fifo + ".done"):
        open(fifo + ".done", "w").close()
        announce(fifo)
    time.sleep(seconds)
    return key


def span(log_path: str, seconds: float) -> tuple[float, float]:
    """Sleep ``seconds``; append "start end" (monotonic) to a log in one O_APPEND write."""
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    append_line(log_path, f"{start!r} {end!r}")
    return start, end


def length(data: Any) -> int:
    """The size of a bytes-like argument (a large one travels through shared memory)."""
    return len(memoryview(data).cast("B"))


def digest(data: bytes) -> str:
    """A digest of a large argument: proves the worker saw exactly what was sent."""
    import hashlib

    return hashlib.sha256(data).hexdigest()


def big_result(size: int, fill: int = 7) -> bytes:
    """A result large enough for shared memory."""
    return bytes([fill]) * size


def die_once_with(marker: str, data: bytes) -> int:
    """die_once, carrying a large argument: its retry must find the argument again."""
    die_once(marker)
    return len(data)


def announce_wait_then_big_result(fifo: str, release: str, data: bytes) -> bytes:
    """Announce, run until ``release`` exists, then return a large result (as large as
    the large argument)."""
    announce_then_wait(fifo, release, 60)
    return bytes([7]) * len(data)


def hold_with(seconds: float, data: bytes) -> int:
    """Sleep, then return the size of a large argument (a short job, prefetched)."""
    time.sleep(seconds)
    return len(data)


def announce_then_sleep_with(fifo: str, seconds: float, data: bytes) -> int:
    """Announce, sleep, return the argument's size (a large argument, for timeouts)."""
    announce(fifo)
    time.sleep(seconds)
    return len(data)


class Mapped:
    """Pickles out of band and rebuilds as a view of whatever buffer it is given: shows
    whether an argument was mapped (zero-copy) rather than copied."""

    def __init__(self, data: Any) -> None:
        self.view = memoryview(data)

    def __reduce_ex__(self, protocol: Any) -> Any:
        import pickle

        return Mapped, (pickle.PickleBuffer(self.view),)


def inspect_mapped(arg: Mapped) -> tuple[str, bool, int]:
    """Where a Mapped argument's memory comes from, whether it is writable, and its first
    byte after the job wrote to it (writes must stay private to this process)."""
    view = arg.view
    if not view.readonly:
        view[0] = 255
    return type(view.obj).__name__, not view.readonly, view[0]


def timer_slack() -> int:
    """This process's timer slack in nanoseconds (Linux)."""
    with open("/proc/self/timerslack_ns") as f:
        return int(f.read())


def by_kind(kind: str, path: str = "") -> str:
    """One function for a map() whose items behave differently: "wait" runs until the
    file ``path`` exists (at most 30 s), "die" ends its worker process at once, anything
    else appends a line to ``path`` (if given) and returns. Returns ``kind``."""
    if kind == "wait":
        deadline = time.monotonic() + 30.0
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
    elif kind == "die":
        os._exit(3)
    elif path:
        with open(path, "a") as out:
            out.write(f"{kind}\n")
    return kind


def set_event(event: Any) -> bool:
    """Set an Event proxy of a multiprocessing.Manager; True once it is set there."""
    event.set()
    return bool(event.is_set())


def put_in(queue: Any, item: Any) -> int:
    """Put ``item`` into a Queue proxy of a multiprocessing.Manager; returns this pid."""
    queue.put(item)
    return os.getpid()


def say(text: str) -> None:
    """Write ``text`` as a line on this worker's stdout (its program's), in one write: a
    line of the program's own never lands inside it."""
    os.write(1, f"{text}\n".encode())
