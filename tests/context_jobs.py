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


def context() -> dict[str, Any]:
    """What current_job() says inside the job, as plain data."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "max_retries": job.max_retries,
        "due": job.due,
        "schedule_id": job.schedule_id,
    }


def log_context(log_path: str) -> None:
    """Append this run's job id, attempt and schedule id to a log (a recurring job)."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    line = f"{job.job_id} {job.attempt} {job.schedule_id} {job.due.timestamp()}\n"
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def attempt_after_dying_once(marker: str) -> int:
    """SIGKILL our own worker on the first run; return the attempt of the next."""
    import signal

    from mpsched import current_job

    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    job = current_job()
    assert job is not None
    return job.attempt


def wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def progress_steps(first: str, second: str, timeout: float = 120.0) -> str:
    """Report 0.25, wait for the file ``first``; report {"step": 2}, wait for ``second``."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    job.set_progress(0.25)
    wait_for_file(first, timeout)
    job.set_progress({"step": 2, "of": 3})
    wait_for_file(second, timeout)
    return "done"


def progress_then_fail(reported: str) -> None:
    """Report 0.5, say so in the file ``reported`` once the manager has it... then fail."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    job.set_progress(0.5)
    wait_for_file(reported, 120)
    raise RuntimeError("gave up half way")


def bad_progress() -> list[str]:
    """The error each bad progress value raises in the job."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    errors = []
    for value in (
        float("nan"),
        1.5,
        -0.1,
        True,
        "half",
        [0.5],
        {"a": object()},
        {"text": "x" * 5000},
    ):
        try:
            job.set_progress(value)  # type: ignore[arg-type]
        except ValueError as exc:
            errors.append(type(exc).__name__)
        else:
            errors.append("accepted")
    job.set_progress(1)
    job.set_progress({"rows": 10, "of": 20})
    return errors


def fail_until(marker: str) -> dict[str, Any]:
    """Raise until the file ``marker`` exists; then return what current_job() says."""
    if not os.path.exists(marker):
        raise ValueError(f"{os.path.basename(marker)} is missing")
    return context()


def log_context_then_fail(log_path: str) -> None:
    """Append "attempt max_retries" to a log (one O_APPEND write), then raise."""
    from mpsched import current_job

    job = current_job()
    assert job is not None
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{job.attempt} {job.max_retries}\n".encode())
    finally:
        os.close(fd)
    raise ValueError(f"attempt {job.attempt}")
