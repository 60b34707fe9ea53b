"""The worker loop (the seed's "Loop 2"): take a due job, run it, report, repeat.

A worker runs each job in its own process, outside any manager lock, and survives any
exception the job raises. Its report rides on its next ``take`` call, so one round trip
both completes a job and asks for the next.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle

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


def worker_main(config: WorkerConfig) -> None:
    """Entry point of a worker process: join the manager, then serve until it stops."""
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the owner, which drains
    faulthandler.enable()
    service = connect_service(config.address, config.authkey)
    service.hello(WorkerHello(
        worker_id=config.worker_id,
        pid=os.getpid(),
        host=host_name(),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        cloudpickle=cloudpickle.__version__,
    ))
    serve(service, config.worker_id)


def serve(service: ServiceProxy, worker_id: str, long_poll: float = LONG_POLL) -> None:
    """Take, run and report jobs until the manager stops or goes away."""
    report: Report | None = None
    while True:
        try:
            assignment = service.take(worker_id, report, long_poll)
        except SchedulerShutdownError:
            return
        except (EOFError, OSError) as exc:
            log.warning("worker %s lost its manager (%s); exiting", worker_id, exc)
            return
        report = None
        if assignment is not None:
            report = Report(assignment.lease.lease_id, run(assignment))


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
    if not isinstance(exc, Exception):
        # SystemExit, KeyboardInterrupt and friends must not escape into the client.
        exc = JobError(f"job {job_id} raised {type(exc).__name__}{exc.args!r}")
    try:
        payload = cloudpickle.dumps(exc)
    except BaseException:
        payload = cloudpickle.dumps(JobError(
            f"job {job_id} raised {type(exc).__qualname__}: {exc} (not picklable)"))
    return Outcome(job_id, False, payload, tb, started, kind)


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
