"""The worker loop (the seed's "Loop 2"): take a due job, run it, report, repeat.

A worker runs each job in its own process, outside any manager lock, and survives any
exception the job raises. Its report rides on its next ``take`` call, so one round trip
both completes a job and asks for the next.

Local workers are started by the manager's supervisor, which watches their sentinels and
reads their delivery acknowledgements from shared memory. Remote workers (``python -m
mpsched worker --connect``) acknowledge each lease with a call, send heartbeats, enforce
their jobs' timeouts themselves, and drain on the first SIGTERM.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import psutil

from mpsched._errors import (
    JobError,
    JobUnpicklingError,
    ResultPicklingError,
    SchedulerShutdownError,
    WorkerRetiredError,
)
from mpsched._job import Assignment, Outcome
from mpsched._protocol import (
    LONG_POLL,
    Exit,
    Report,
    ServiceProxy,
    WorkerHello,
    WorkerLoad,
    connect_service,
)
from mpsched._transport import describe_versions, host_name

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
    heartbeat_interval: float = 2.0  # remote workers only


class Draining(Exception):
    """Raised by the SIGTERM handler to interrupt an idle remote worker's take."""


@dataclass
class _DrainState:
    draining: bool = False
    in_take: bool = False

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.draining:  # the second SIGTERM kills
            _kill_children()
            os._exit(128 + signum)
        self.draining = True
        if self.in_take:
            raise Draining


def _setup(config: WorkerConfig, lifeline: Connection | None) -> None:
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the owner, which drains
    faulthandler.enable()
    if lifeline is not None:
        threading.Thread(target=_exit_with_parent, args=(lifeline,), daemon=True,
                         name="mpsched-lifeline").start()


def _hello(worker_id: str, remote: bool) -> WorkerHello:
    python, cp = describe_versions()
    return WorkerHello(worker_id, os.getpid(), host_name(), python, cp, remote)


def worker_main(config: WorkerConfig, ack: Any = None, lifeline: Connection | None = None) -> None:
    """Entry point of a local worker process: join the manager, serve until it stops.

    Args:
        ack: a shared int the worker sets to each lease id it receives, so the manager can
            tell a job that never arrived (requeued untouched) from one that started.
        lifeline: the read end of a pipe only the manager writes to; when it closes the
            manager is gone and this worker exits at once, even in the middle of a job.
    """
    _setup(config, lifeline)
    service = connect_service(config.address, config.authkey)
    service.hello(_hello(config.worker_id, remote=False))

    def received(lease_id: int) -> None:
        if ack is not None:
            ack.value = lease_id

    serve(service, config, received)


def remote_worker_main(config: WorkerConfig, lifeline: Connection | None = None) -> int:
    """Entry point of a remote worker process; returns its exit code.

    Joins again under a new id if the manager declared it gone (a network cut longer than
    the heartbeat timeout). The first SIGTERM drains: the current job finishes and is
    reported, no new job is taken.
    """
    _setup(config, lifeline)
    drain = _DrainState()
    signal.signal(signal.SIGTERM, drain.on_sigterm)
    for rejoin in range(1_000_000):
        worker_id = f"{config.worker_id}.{rejoin}"
        service = connect_service(config.address, config.authkey)
        timeout = service.hello(_hello(worker_id, remote=True))
        # Several beats per timeout, whatever --heartbeat-interval says.
        config = replace(config, heartbeat_interval=min(config.heartbeat_interval, timeout / 4))
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeats, args=(service, worker_id, config, stop),
                                daemon=True, name="mpsched-heartbeat")
        beat.start()
        acknowledge = _acknowledger(service, worker_id)
        try:
            ended = serve(service, replace(config, worker_id=worker_id), acknowledge, drain)
            return 1 if ended == "lost" else 0
        except WorkerRetiredError:
            log.warning("worker %s was declared gone by the manager; joining again", worker_id)
        finally:
            stop.set()
    return 1


def _acknowledger(service: ServiceProxy, worker_id: str) -> Callable[[int], None]:
    def acknowledge(lease_id: int) -> None:
        service.ack(worker_id, lease_id)

    return acknowledge


def _heartbeats(service: ServiceProxy, worker_id: str, config: WorkerConfig,
                stop: threading.Event) -> None:
    me = psutil.Process()
    me.cpu_percent(None)
    while not stop.wait(config.heartbeat_interval):
        try:
            service.heartbeat(worker_id, WorkerLoad(me.cpu_percent(None), me.memory_info().rss))
        except (WorkerRetiredError, SchedulerShutdownError, EOFError, OSError):
            return


def _exit_with_parent(lifeline: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    log.warning("worker pid %d: its manager or parent is gone; exiting", os.getpid())
    _kill_children()
    os._exit(1)


def kill_tree(pid: int | None, *, include_root: bool = True) -> None:
    """SIGKILL a process's descendants, then (unless ``include_root`` is False) itself."""
    if pid is None:
        return
    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    if include_root:
        family.append(root)
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _kill_children() -> None:
    kill_tree(os.getpid(), include_root=False)


def serve(service: ServiceProxy, config: WorkerConfig, received: Callable[[int], None],
          drain: _DrainState | None = None, long_poll: float = LONG_POLL) -> str:
    """Take, run and report jobs until the manager stops ("stopped") or goes away ("lost"),
    the worker drains ("drained"), or it is time to recycle this process ("recycled":
    ``max_tasks`` / ``max_memory``)."""
    worker_id = config.worker_id
    report: Report | None = None
    done = 0
    while drain is None or not drain.draining:
        try:
            assignment = _take(service, worker_id, report, long_poll, drain)
        except Draining:
            break
        except SchedulerShutdownError:
            return "stopped"
        except (EOFError, OSError) as exc:
            log.warning("worker %s lost its manager (%s); exiting", worker_id, exc)
            return "lost"
        report = None
        if assignment is None:
            continue
        received(assignment.lease.lease_id)
        report = Report(assignment.lease.lease_id, _run_guarded(assignment, drain, service,
                                                                 worker_id))
        done += 1
        if _should_recycle(config, done):
            log.info("worker %s recycles after %d job(s)", worker_id, done)
            _leave(config, worker_id, report, drain is not None)
            return "recycled"
    _leave(config, worker_id, report, drain is not None)
    return "drained"


def _take(service: ServiceProxy, worker_id: str, report: Report | None, long_poll: float,
          drain: _DrainState | None) -> Assignment | None:
    if drain is None:
        return service.take(worker_id, report, long_poll)
    drain.in_take = True
    try:
        return service.take(worker_id, report, long_poll)
    finally:
        drain.in_take = False


def _leave(config: WorkerConfig, worker_id: str, report: Report | None, remote: bool) -> None:
    # A fresh connection: a take interrupted by SIGTERM left the old one mid-reply.
    with contextlib.suppress(Exception):
        service = connect_service(config.address, config.authkey)
        if remote:
            service.leave(worker_id, report)
        else:
            service.finish(worker_id, report)


def _run_guarded(assignment: Assignment, drain: _DrainState | None, service: ServiceProxy,
                 worker_id: str) -> Outcome:
    """Run a job; a remote worker also enforces its timeout by exiting when it passes."""
    if drain is None or assignment.timeout is None:
        return run(assignment)
    timer = threading.Timer(assignment.timeout, _timed_out, args=(service, worker_id))
    timer.daemon = True
    timer.start()
    try:
        return run(assignment)
    finally:
        timer.cancel()


def _timed_out(service: ServiceProxy, worker_id: str) -> None:
    log.warning("worker %s: job ran past its timeout; exiting", worker_id)
    _kill_children()
    with contextlib.suppress(Exception):
        service.leave(worker_id, None)
    os._exit(Exit.JOB_TIMEOUT)


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
        if isinstance(fn, bytes):  # map(): the callable was pickled once, separately
            fn = cloudpickle.loads(fn)
    except BaseException as exc:
        hint = _MISSING_MODULE_HINT if isinstance(exc, ModuleNotFoundError) else ""
        unpickling = JobUnpicklingError(
            f"job {job_id}: the worker could not unpickle it: {exc!r}{hint}")
        return _failure(job_id, unpickling, _format(exc), None, "job-unpickling")
    started = _wait_until(assignment.due)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        return _failure(job_id, exc, _format(exc), started, "")
    try:
        payload = _dumps(result)
    except BaseException as exc:
        pickling = ResultPicklingError(
            f"job {job_id} returned a {type(result).__qualname__} that could not be pickled: "
            f"{exc!r}")
        return _failure(job_id, pickling, _format(exc), started, "result-pickling")
    return Outcome(job_id, True, payload, "", started)


_MISSING_MODULE_HINT = (
    ". Workers import a job's functions by module name, from their working directory and "
    "PYTHONPATH; functions from __main__ and lambdas travel by value. For a module only the "
    "client has, call cloudpickle.register_pickle_by_value(module) in the client before "
    "submitting, or install the module where the workers run.")


def _wait_until(due: float) -> float:
    """Sleep until ``due`` (a job handed out early, see EARLY_HANDOFF); return the time."""
    now = time.monotonic()
    while now < due:
        time.sleep(due - now)
        now = time.monotonic()
    return now


def _dumps(result: Any) -> bytes:
    # The C pickler is several times faster than cloudpickle's; cloudpickle is needed only
    # for what plain pickle refuses (lambdas, classes the job defined by value).
    try:
        return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return bytes(cloudpickle.dumps(result))


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
