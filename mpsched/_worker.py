"""The worker loop (the seed's "Loop 2"): take a due job, run it, report, repeat.

A worker runs each job in its own process, outside any manager lock, and survives any
exception the job raises. Its report rides on its next ``take`` call, so one round trip
both completes a job and asks for the next.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import psutil

from mpsched._errors import (
    JobError,
    JobUnpicklingError,
    ResultPicklingError,
    SchedulerShutdownError,
)
from mpsched._job import Assignment, Outcome
from mpsched._manager import (
    LONG_POLL,
    Report,
    ServiceProxy,
    WorkerHello,
    connect_service,
    host_name,
)

log = logging.getLogger("mpsched.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker process needs to find and join its manager."""

    address: Any
    authkey: bytes
    worker_id: str
    log_level: int = logging.WARNING
    max_tasks: int | None = None  # leave (and be replaced) after this many jobs
    max_memory: int | None = None  # leave after a job that leaves RSS above this (bytes)


def worker_main(config: WorkerConfig, ack: Any = None, lifeline: Connection | None = None) -> None:
    """Entry point of a worker process: join the manager, then serve until it stops.

    Args:
        ack: a shared int the worker sets to each lease id it receives, so the manager can
            tell a job that never arrived (requeued untouched) from one that started.
        lifeline: the read end of a pipe only the manager writes to; when it closes the
            manager is gone and this worker exits at once, even in the middle of a job.
    """
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the owner, which drains
    faulthandler.enable()
    if lifeline is not None:
        threading.Thread(target=_exit_with_manager, args=(lifeline,), daemon=True,
                         name="mpsched-lifeline").start()
    service = connect_service(config.address, config.authkey)
    service.hello(WorkerHello(
        worker_id=config.worker_id,
        pid=os.getpid(),
        host=host_name(),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        cloudpickle=cloudpickle.__version__,
    ))
    serve(service, config, ack)


def _exit_with_manager(lifeline: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    log.warning("worker pid %d: manager gone; exiting", os.getpid())
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    os._exit(1)


def serve(service: ServiceProxy, config: WorkerConfig, ack: Any = None,
          long_poll: float = LONG_POLL) -> None:
    """Take, run and report jobs until the manager stops or goes away, or it is time to
    recycle this process (``max_tasks`` / ``max_memory``)."""
    worker_id = config.worker_id
    report: Report | None = None
    done = 0
    while True:
        try:
            assignment = service.take(worker_id, report, long_poll)
        except SchedulerShutdownError:
            return
        except (EOFError, OSError) as exc:
            log.warning("worker %s lost its manager (%s); exiting", worker_id, exc)
            return
        report = None
        if assignment is None:
            continue
        if ack is not None:
            ack.value = assignment.lease.lease_id
        report = Report(assignment.lease.lease_id, run(assignment))
        done += 1
        if _should_recycle(config, done):
            log.info("worker %s recycles after %d job(s)", worker_id, done)
            with contextlib.suppress(EOFError, OSError):
                service.finish(worker_id, report)
            return


def _should_recycle(config: WorkerConfig, done: int) -> bool:
    if config.max_tasks is not None and done >= config.max_tasks:
        return True
    if config.max_memory is not None:
        return bool(psutil.Process().memory_info().rss > config.max_memory)
    return False


def run(assignment: Assignment) -> Outcome:
    """Unpickle and run one job; never raises: every failure becomes an Outcome."""
    job_id = assignment.lease.job_id
    try:
        fn, args, kwargs = cloudpickle.loads(assignment.payload)
    except BaseException as exc:
        unpickling = JobUnpicklingError(f"job {job_id}: the worker could not unpickle it: {exc!r}")
        return _failure(job_id, unpickling, _format(exc), None, "job-unpickling")
    started = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        return _failure(job_id, exc, _format(exc), started, "")
    try:
        payload = cloudpickle.dumps(result)
    except BaseException as exc:
        pickling = ResultPicklingError(
            f"job {job_id} returned a {type(result).__qualname__} that could not be pickled: "
            f"{exc!r}")
        return _failure(job_id, pickling, _format(exc), started, "result-pickling")
    return Outcome(job_id, True, payload, "", started)


def _failure(job_id: str, exc: BaseException, tb: str, started: float | None,
             kind: str) -> Outcome:
    if isinstance(exc, SystemExit):
        exc = JobError(f"job {job_id} called sys.exit({exc.code!r})")
    elif not isinstance(exc, Exception):
        # KeyboardInterrupt and friends must not escape into the client.
        exc = JobError(f"job {job_id} raised {type(exc).__name__}{exc.args!r}")
    try:
        payload = cloudpickle.dumps(exc)
    except BaseException:
        payload = cloudpickle.dumps(JobError(
            f"job {job_id} raised {type(exc).__qualname__}: {exc} (not picklable)"))
    return Outcome(job_id, False, payload, tb, started, kind)


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
