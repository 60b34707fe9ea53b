"""Local worker processes: start them, watch their sentinels, replace the dead, stop them.

Runs in the manager process. Workers are started with an explicit start method (spawn or
forkserver), never by forking this process, which has server threads.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mpsched._errors import WorkerCrashedError
from mpsched._job import Outcome
from mpsched._manager import ManagerConfig, ManagerService
from mpsched._worker import WorkerConfig, worker_main

log = logging.getLogger("mpsched.supervisor")

STOP = "stop"  # the owner's message on the control pipe


class Supervisor:
    """Keeps ``config.workers`` local worker processes alive until stopped."""

    def __init__(self, service: ManagerService, config: ManagerConfig, address: Any) -> None:
        self._service = service
        self._config = config
        self._address = address
        self._ctx: Any = multiprocessing.get_context(config.mp_method)
        if config.mp_method == "forkserver":
            self._ctx.set_forkserver_preload(["mpsched._worker"])
        self._procs: dict[str, BaseProcess] = {}  # touched by the manager's main thread only
        self._ids = itertools.count(1)

    def start_workers(self) -> None:
        for _ in range(self._config.workers):
            self._start_one()

    def _start_one(self) -> None:
        worker_id = f"w{next(self._ids)}"
        config = WorkerConfig(self._address, self._config.authkey, worker_id,
                              self._config.log_level)
        proc = self._ctx.Process(target=worker_main, args=(config,),
                                 name=f"mpsched-worker-{worker_id}")
        proc.start()
        self._procs[worker_id] = proc

    def await_workers(self, timeout: float) -> str:
        """Wait until every worker said hello; returns why not ("" when they all did)."""
        deadline = time.monotonic() + timeout
        while self._service.worker_count() < len(self._procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"workers did not start within {timeout} s"
            sentinels: dict[Any, BaseProcess] = {p.sentinel: p for p in self._procs.values()}
            ready = wait([self._service.wake_reader, *sentinels], remaining)
            self._drain_wake()
            for sentinel in ready:
                proc = sentinels.get(sentinel)
                if proc is not None:
                    proc.join()
                    return f"worker pid {proc.pid} exited with code {proc.exitcode} at start"
        return ""

    def _drain_wake(self) -> None:
        os.set_blocking(self._service.wake_reader, False)
        try:
            while os.read(self._service.wake_reader, 4096):
                pass
        except BlockingIOError:
            pass

    def watch(self, control: Connection) -> None:
        """Serve until the owner says stop or goes away, or ``service.stop()`` is called."""
        while not self._service.stopping.is_set():
            by_sentinel: dict[Any, str] = {p.sentinel: w for w, p in self._procs.items()}
            ready = wait([control, self._service.wake_reader, *by_sentinel])
            if control in ready:
                try:
                    message = control.recv()
                except (EOFError, OSError):
                    log.warning("the process that started this manager is gone; stopping")
                    return
                if message == STOP:
                    return
            if self._service.wake_reader in ready:
                self._drain_wake()
            for sentinel in ready:
                worker_id = by_sentinel.get(sentinel)
                if worker_id is not None:
                    self._on_exit(worker_id)

    def _on_exit(self, worker_id: str) -> None:
        proc = self._procs.pop(worker_id)
        proc.join()
        self._service.forget_worker(worker_id)
        lost = self._service.queue.release_worker(worker_id)
        if self._service.stopping.is_set():
            return
        log.error("worker %s (pid %s) exited with code %s holding %d job(s); replacing it",
                  worker_id, proc.pid, proc.exitcode, len(lost))
        for job, _lease in lost:
            self._service.queue.fail(job)
            error = WorkerCrashedError(job.job_id, worker_id, proc.exitcode)
            self._service.mailboxes.post(job.client_id, Outcome(
                job.job_id, False, pickle.dumps(error), "", None, "worker-crashed"))
        self._start_one()

    def stop_workers(self, grace: float = 5.0) -> None:
        """Wait up to ``grace`` seconds for workers to leave, then terminate, then kill."""
        deadline = time.monotonic() + grace
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs.values():
            if proc.is_alive():
                log.warning("worker pid %s did not stop in %.1f s; terminating", proc.pid, grace)
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, 9)
                proc.join(1.0)
        self._procs.clear()
