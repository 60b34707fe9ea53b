"""A worker process's set-up and its ways out: what it needs to join its manager,
signals, the lifeline to its manager or parent, a remote worker's drain (its first
SIGTERM) and job timeouts, and process-tree kills.

Local workers are started by the manager's supervisor, which watches their sentinels;
remote workers (``python -m mpsched worker --connect``, see mpsched._worker.remote) enforce
their jobs' timeouts themselves (JobTimeouts) and drain on the first SIGTERM (DrainState).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil

from mpsched._protocol.records import WorkerHello
from mpsched._transport.sockets import describe_versions, host_name
from mpsched._transport.tls import TlsConfig, set_tls

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
    # Local workers: the manager's ManagerService.local_token, said in the hello to prove
    # this worker was started by the manager and so shares its monotonic clock.
    local_token: str = ""
    # Remote workers: wait (with backoff) for an unreachable manager at start instead of
    # failing. Replacements started by a pool are patient; the first workers are not, so a
    # wrong address fails fast.
    wait_for_manager: bool = False
    tls: TlsConfig | None = None  # TLS for a TCP address (mpsched._transport.tls)
    # Local workers of a manager using shared memory: its segment prefix. A large result
    # of a job whose client maps shared memory goes there (mpsched._payload.segments).
    shm_prefix: str = ""
    queues: tuple[str, ...] | None = None  # the queues it serves in order; None: every one


class Draining(Exception):
    """Raised by the SIGTERM handler to interrupt an idle remote worker's wait."""


@dataclass
class DrainState:
    """A remote worker's drain flag, set by its first SIGTERM."""

    draining: bool = False
    waiting: bool = False  # in an interruptible wait: the handler raises Draining into it

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.draining:  # the second SIGTERM kills
            _kill_children()
            os._exit(128 + signum)
        self.draining = True
        if self.waiting:
            raise Draining

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A wait (a take, a reconnect back-off) the first SIGTERM ends with Draining.

        Raises:
            Draining: the worker drains (before or during the wait).
        """
        self.waiting = True
        try:
            if self.draining:  # a SIGTERM that came just before we set ``waiting``
                raise Draining
            yield
        finally:
            self.waiting = False


def setup_process(config: WorkerConfig, lifeline: Connection | None) -> None:
    """Logging, signals and the lifeline thread of a worker process."""
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the owner, which drains
    faulthandler.enable()
    _tighten_timer_slack()
    set_tls(config.tls)  # a process's TLS setting is its own: started processes get none
    if lifeline is not None:
        threading.Thread(
            target=_exit_with_parent, args=(lifeline,), daemon=True, name="mpsched-lifeline"
        ).start()


PR_SET_TIMERSLACK = 29  # linux/prctl.h


def _tighten_timer_slack() -> None:
    """Ask Linux to end this process's sleeps on time: a 1 ns timer slack instead of the
    default 50 µs, which halves how late a timed sleep wakes (a job handed out early
    sleeps until it is due, so the slack would add to its lateness). Elsewhere, or if
    refused, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def make_hello(
    worker_id: str, *, remote: bool, local_token: str = "", queues: tuple[str, ...] | None = None
) -> WorkerHello:
    """This process's hello under ``worker_id``, serving ``queues`` (None: every one)."""
    python, cp = describe_versions()
    return WorkerHello(
        worker_id=worker_id,
        pid=os.getpid(),
        host=host_name(),
        python=python,
        cloudpickle=cp,
        remote=remote,
        local_token=local_token,
        queues=queues,
    )


class JobTimeouts:
    """Ends a remote worker's process when its running job passes its timeout.

    The job runs in this process, so the only way to stop it is to exit (the manager then
    fails it with JobTimeoutError and the pool starts another worker). A timer can fire just
    as its job returns, too late for ``cancel``: it then finds that job no longer running
    and does nothing, instead of killing the next, innocent job.

    Args:
        on_expired: called (in the timer's thread) to end the process; it should not return.
        timer: ``threading.Timer`` or a test's stand-in with the same signature.
    """

    def __init__(
        self, on_expired: Callable[[], None], timer: Callable[..., Any] = threading.Timer
    ) -> None:
        self._on_expired = on_expired
        self._timer = timer
        # Guards _running. A job's start and end take it in the worker's main thread; an
        # expiring timer takes it, checks its job still runs, and ends the process holding
        # it, so no job can finish or start meanwhile. Nobody waits on it for long.
        self._lock = threading.Lock()
        self._running: object | None = None  # the token of the job under a timeout

    @contextlib.contextmanager
    def guard(self, timeout: float | None) -> Iterator[None]:
        """Run the body as one job that may take ``timeout`` seconds (None: no limit)."""
        if timeout is None:
            yield
            return
        token = object()  # not the lease id: ids start again after a manager restart
        timer = self._timer(timeout, self._expire, args=(token,))
        timer.daemon = True
        with self._lock:
            self._running = token
        timer.start()
        try:
            yield
        finally:
            with self._lock:
                self._running = None
            timer.cancel()

    def _expire(self, token: object) -> None:
        with self._lock:
            if self._running is token:
                self._on_expired()


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
