"""``python -m mpsched worker --connect``: remote worker processes and the pool that keeps them.

A remote worker process (``remote_worker_main``) joins the manager, acknowledges each lease,
sends heartbeats and enforces its jobs' timeouts itself. It never reads the manager's clock:
the manager hands it a job when the job is due. When the manager goes away (refused, reset,
end of file) the worker retries with back-off, 0.1 s doubling to 5 s, for as long as it is
not told to drain, and joins again under a new id when the manager answers. When the manager
stops cleanly (its queue closed) the worker exits: from here a shutdown and a stop before a
restart look the same, and a pool waiting for a manager that is never coming back would hang
whoever runs it.

The pool (``WorkerPool``) keeps ``processes`` workers: it starts another whenever one exits
while the pool is not draining, whatever its exit code (a job may call ``os._exit(0)``, or
``os._exit(3)``). A worker that exits on purpose first says why in a shared slot, its
verdict, so a job's exit code can never pass for one: a refused key or version stops every
worker (the pool exits AUTH or VERSION), as does an unreachable manager at the first start
(UNREACHABLE; the CLI probes first); a stopped manager drains the pool, which exits 0.
First SIGTERM or SIGINT: every worker drains (finishes its job, takes no more) and the pool
exits 0. Second: the workers are killed.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from mpsched._errors import (
    AuthenticationError,
    SchedulerShutdownError,
    VersionMismatchError,
    WorkerRetiredError,
)
from mpsched._protocol import Exit, ServiceProxy, WorkerLoad, connect_service
from mpsched._transport import format_address, host_name
from mpsched._worker import (
    Draining,
    DrainState,
    JobTimeouts,
    WorkerConfig,
    kill_tree,
    make_hello,
    serve,
    setup_process,
)

log = logging.getLogger("mpsched.remote")

RECONNECT_FIRST = 0.1  # seconds before the first retry of an unreachable manager
RECONNECT_MAX = 5.0  # the back-off doubles up to this


# ------------------------------------------------------------------------------ a worker


def remote_worker_main(config: WorkerConfig, lifeline: Connection | None = None) -> str:
    """Entry point of a remote worker process; returns why it ended.

    Returns "stopped" (the manager stopped), "drained" (SIGTERM) or "recycled"
    (``max_tasks`` / ``max_memory``). Joins again under a new id when the manager declared
    it gone (a network cut longer than the heartbeat timeout) or went away and came back.

    Raises:
        AuthenticationError, VersionMismatchError: the manager refused this worker.
        OSError, EOFError: no manager answered the first join (unless
            ``config.wait_for_manager``).
    """
    setup_process(config, lifeline)
    drain = DrainState()
    signal.signal(signal.SIGTERM, drain.on_sigterm)
    patient = config.wait_for_manager
    ended = ""
    for rejoin in itertools.count():
        worker_id = f"{config.worker_id}.{rejoin}"
        try:
            service, heartbeat_timeout = _join(config, worker_id, drain, patient=patient,
                                               outage_logged=ended == "lost")
        except Draining:
            return "drained"
        patient = True  # joined once: from now on an unreachable manager is an outage
        ended = _session(service, replace(config, worker_id=worker_id), heartbeat_timeout,
                         drain)
        if ended == "lost":
            service.abandon()
        elif ended != "retired":
            if ended == "stopped":
                log.info("worker %s: the manager at %s stopped; exiting", worker_id,
                         format_address(config.address))
            return ended
    raise AssertionError("itertools.count() ended")  # pragma: no cover


def _join(config: WorkerConfig, worker_id: str, drain: DrainState, *, patient: bool,
          outage_logged: bool) -> tuple[ServiceProxy, float]:
    """Connect and say hello; returns the service and its heartbeat timeout.

    While ``patient``, an unreachable manager is retried with back-off. An outage is logged
    once at WARNING (here, unless ``outage_logged``: serve() said it lost the manager), and
    the join that ends it at INFO.

    Raises:
        Draining: SIGTERM, before or while waiting.
        AuthenticationError, VersionMismatchError: the manager refused this worker.
        OSError, EOFError: the manager is unreachable and not ``patient``.
    """
    where = format_address(config.address)
    backoff = RECONNECT_FIRST
    since = time.monotonic()
    while True:
        service: ServiceProxy | None = None
        try:
            with drain.interruptible():
                service = connect_service(config.address, config.authkey)
                heartbeat_timeout = service.hello(make_hello(worker_id, remote=True))
        except (EOFError, OSError) as exc:
            if service is not None:
                service.abandon()  # it went away after we connected
            if not patient:
                raise
            if not outage_logged:
                log.warning("worker %s: no manager answers at %s (%s); retrying until it does",
                            worker_id, where, exc)
                outage_logged = True
        else:
            if outage_logged:
                log.info("worker %s: reconnected to the manager at %s after %.1f s",
                         worker_id, where, time.monotonic() - since)
            return service, heartbeat_timeout
        with drain.interruptible():
            time.sleep(backoff)
        backoff = min(backoff * 2, RECONNECT_MAX)


def _session(service: ServiceProxy, config: WorkerConfig, heartbeat_timeout: float,
             drain: DrainState) -> str:
    """Serve one joined connection; returns serve()'s end, or "retired" (join again)."""
    # Several beats per timeout, whatever --heartbeat-interval says.
    interval = min(config.heartbeat_interval, heartbeat_timeout / 4)
    # Set when this session ends; the heartbeat thread waits on it between beats.
    stop = threading.Event()
    threading.Thread(target=_heartbeats, args=(service, config.worker_id, interval, stop),
                     daemon=True, name="mpsched-heartbeat").start()
    timeouts = JobTimeouts(functools.partial(_timed_out, service, config.worker_id))
    try:
        return serve(service, config, _acknowledger(service, config.worker_id), drain,
                     timeouts=timeouts)
    except WorkerRetiredError:
        log.warning("worker %s was declared gone by the manager; joining again",
                    config.worker_id)
        return "retired"
    finally:
        stop.set()


def _acknowledger(service: ServiceProxy, worker_id: str) -> Callable[[int], None]:
    def acknowledge(lease_id: int) -> None:
        service.ack(worker_id, lease_id)

    return acknowledge


def _heartbeats(service: ServiceProxy, worker_id: str, interval: float,
                stop: threading.Event) -> None:
    # The first beat goes at once: until it arrives, status shows no CPU or memory.
    me = psutil.Process()
    me.cpu_percent(None)
    while True:
        try:
            service.heartbeat(worker_id, WorkerLoad(me.cpu_percent(None), me.memory_info().rss))
        except (WorkerRetiredError, SchedulerShutdownError, EOFError, OSError):
            return
        if stop.wait(interval):
            return


def _timed_out(service: ServiceProxy, worker_id: str) -> None:
    log.warning("worker %s: job ran past its timeout; exiting", worker_id)
    kill_tree(os.getpid(), include_root=False)
    with contextlib.suppress(Exception):
        service.leave(worker_id, None)
    os._exit(Exit.JOB_TIMEOUT)


# ------------------------------------------------------------------------------ the pool


class _Verdict(enum.IntEnum):
    """Why a worker process exited, as it says in its shared slot just before."""

    UNSAID = 0  # nothing said: a job's os._exit, a crash, a signal, a job timeout
    LEFT = 1  # drained or recycled
    MANAGER_STOPPED = 2
    AUTH = Exit.AUTH  # the fatal ones: the pool stops and exits with the same code
    VERSION = Exit.VERSION
    UNREACHABLE = Exit.UNREACHABLE


FATAL = {_Verdict.AUTH, _Verdict.VERSION, _Verdict.UNREACHABLE}


def _child(config: WorkerConfig, lifeline: Connection, verdict: Any) -> None:
    config = replace(config, worker_id=f"{host_name()}:{os.getpid()}")
    said = _Verdict.LEFT
    try:
        if remote_worker_main(config, lifeline) == "stopped":
            said = _Verdict.MANAGER_STOPPED
    except AuthenticationError as exc:
        print(f"mpsched worker: {exc}", file=sys.stderr)
        said = _Verdict.AUTH
    except VersionMismatchError as exc:
        print(f"mpsched worker: refused: {exc}", file=sys.stderr)
        said = _Verdict.VERSION
    except (EOFError, OSError) as exc:
        print(f"mpsched worker: no manager at the address: {exc}", file=sys.stderr)
        said = _Verdict.UNREACHABLE
    verdict.value = said
    sys.exit(int(said) if said in FATAL else 0)


@dataclass(eq=False)
class _Worker:
    proc: BaseProcess
    verdict: Any  # shared int: a _Verdict the process sets before it exits on purpose


class WorkerPool:
    """The parent of ``processes`` remote worker processes."""

    def __init__(self, config: WorkerConfig, processes: int, method: str) -> None:
        self._config = config
        self._processes = processes
        self._ctx: Any = multiprocessing.get_context(method)
        # Children exit when this process dies: only it holds the write end.
        self._lifeline_r, self._lifeline_w = self._ctx.Pipe(duplex=False)
        self._workers: list[_Worker] = []  # touched by the main thread only
        self._draining = False  # no more replacements: a signal, a fatal or a stop
        self._signals = 0
        self._killed_by = 0  # the signal that made us kill the workers (the second one)

    def run(self) -> int:
        """Run until every worker has left; returns the pool's exit code."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for _ in range(self._processes):
            self._start(patient=False)
        result = Exit.OK
        while self._workers:
            ready = wait([w.proc.sentinel for w in self._workers])
            for worker in [w for w in self._workers if w.proc.sentinel in ready]:
                worker.proc.join()
                self._workers.remove(worker)
                result = self._on_exit(worker, result)
        self._lifeline_w.close()
        if self._killed_by:
            return 128 + self._killed_by  # as a process killed by that signal would
        return int(result)

    def _on_exit(self, worker: _Worker, result: Exit) -> Exit:
        """Replace a worker that left, unless it says the pool must stop; returns the code."""
        said, code = worker.verdict.value, worker.proc.exitcode
        if said in FATAL:
            self._drain()
            return Exit(said) if result == Exit.OK else result
        if said == _Verdict.MANAGER_STOPPED:
            if not self._draining:
                log.warning("the manager at %s stopped; the pool exits",
                            format_address(self._config.address))
            self._drain()
            return result
        if not self._draining:
            if said == _Verdict.UNSAID:
                log.warning("worker pid %s exited with %s; starting another", worker.proc.pid,
                            code)
            else:
                log.info("worker pid %s left; starting another", worker.proc.pid)
            # It replaces a worker that had joined: if the manager is away just now, it
            # waits for it rather than stopping the pool.
            self._start(patient=True)
        return result

    def _start(self, *, patient: bool) -> None:
        verdict = self._ctx.RawValue("i", _Verdict.UNSAID)
        config = replace(self._config, wait_for_manager=patient)
        proc = self._ctx.Process(target=_child, args=(config, self._lifeline_r, verdict),
                                 name="mpsched-remote-worker")
        proc.start()
        self._workers.append(_Worker(proc, verdict))

    def _drain(self) -> None:
        if not self._draining:
            self._draining = True
            self._signal_all(signal.SIGTERM)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning("received %s: draining workers", signal.Signals(signum).name)
            self._drain()  # once: a worker takes a second SIGTERM as a kill
        else:
            self._killed_by = signum
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, signum: int) -> None:
        for worker in self._workers:
            if worker.proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.proc.pid, signum)
