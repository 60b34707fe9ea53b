"""Local worker processes and remote heartbeats: watch them, resolve what the dead held.

Runs in the manager process, in its main thread. Local workers are started with an explicit
start method (spawn or forkserver), never by forking this process, which has server threads.

What happens to a job whose worker dies (design.md §5, ManagerService._resolve_lost):
- past its ``timeout`` (we killed it, or it died late): JobTimeoutError;
- never received (the worker had not acknowledged the lease): back to the heap untouched;
  it is neither an attempt nor a failure;
- received, attempts left (``retries``): back to the heap, first among what is due;
- otherwise: WorkerCrashedError naming the exit code or signal.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mpsched._core.options import Option
from mpsched._manager.service import ManagerService
from mpsched._protocol.records import (
    STOP,
    STOP_NOW,
    ManagerConfig,
    StartMethod,
)
from mpsched._worker.claims import ClaimSlot, LocalClaims
from mpsched._worker.loop import worker_main
from mpsched._worker.process import WorkerConfig, kill_tree
from mpsched._worker.slot_file import AnonymousSlots, SlotSource

log = logging.getLogger("mpsched.supervisor")


class WatchEnd(Option):
    """Why the supervisor stopped watching: the words of the owner's control messages."""

    STOP = STOP  # stop: running jobs may finish (the owner's message, or stop())
    STOP_NOW = STOP_NOW  # stop, killing the workers with their jobs (a second Ctrl-C)
    OWNER_GONE = "owner-gone"  # the process that started this manager died


# A worker that fails to start is tried again after this many seconds, doubling each time
# up to the second value; a success resets it.
RESTART_BACKOFF = (0.1, 10.0)


@dataclass(eq=False)
class _Local:
    """One local worker process and its claim slot (mpsched._worker.claims)."""

    proc: BaseProcess
    slot: ClaimSlot  # shared: the last lease id it received or started, and its claims


class Supervisor:
    """Keeps ``config.workers`` local worker processes alive until stopped."""

    def __init__(
        self,
        service: ManagerService,
        config: ManagerConfig,
        address: Any,
        claims: LocalClaims | None = None,
        slots: SlotSource | None = None,
    ) -> None:
        """``claims``: the queue's; each local worker's slot is added while it lives.
        ``slots``: where the slots are made (a SQLite store's slot file; by default
        anonymous shared memory)."""
        self._service = service
        self._claims = claims if claims is not None else LocalClaims()
        self._slots = slots if slots is not None else AnonymousSlots()
        self._config = config
        self._address = address
        self._ctx: Any = multiprocessing.get_context(config.mp_method)
        if config.mp_method == StartMethod.FORKSERVER:
            self._ctx.set_forkserver_preload(["mpsched._worker.loop"])
        # Workers watch the read end; only this process holds the write end, so it closes
        # (and they exit) when this process dies, however it dies.
        self._lifeline_r, self._lifeline_w = self._ctx.Pipe(duplex=False)
        # Everything below is touched by the manager's main thread only.
        self._workers: dict[str, _Local] = {}
        self._killed: dict[str, int] = {}  # worker id -> the lease we killed it for
        self._ids = itertools.count(1)
        self._missing = 0  # workers to start again after a failed start
        self._next_start = 0.0  # monotonic time of the next attempt
        self._backoff = RESTART_BACKOFF[0]

    def start_workers(self) -> None:
        for _ in range(self._config.workers):
            self._start_one()

    def _start_one(self) -> None:
        worker_id = f"w{next(self._ids)}"
        slot = self._slots.slot(self._ctx, worker_id)
        config = WorkerConfig(
            address=self._address,
            authkey=self._config.authkey,
            worker_id=worker_id,
            log_level=self._config.log_level,
            max_tasks=self._config.max_tasks_per_worker,
            max_memory=self._config.max_memory_per_worker,
            local_token=self._service.workers.local_token,
            shm_prefix=self._service.segments.prefix,
            queues=self._config.queues,
            tls=None if self._config.tls is None else self._config.tls.for_local_workers(),
        )
        proc = self._ctx.Process(
            target=worker_main,
            args=(config, slot, self._lifeline_r),
            name=f"mpsched-worker-{worker_id}",
        )
        try:
            proc.start()
        except BaseException:
            self._slots.release(slot)
            raise
        self._workers[worker_id] = _Local(proc, slot)
        self._claims.add(worker_id, slot)

    def await_workers(self, timeout: float) -> str:
        """Wait until every local worker said hello; returns why not ("" when all did)."""
        deadline = time.monotonic() + timeout
        while self._service.worker_count() < len(self._workers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"workers did not start within {timeout} s"
            sentinels: dict[Any, BaseProcess] = {
                w.proc.sentinel: w.proc for w in self._workers.values()
            }
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
        with contextlib.suppress(BlockingIOError):
            while os.read(self._service.wake_reader, 4096):
                pass

    def _restart_missing(self) -> None:
        """Start the workers whose replacement failed, once their backoff has passed."""
        while self._missing and time.monotonic() >= self._next_start:
            try:
                self._start_one()
            except Exception as exc:
                self._service.note_workers(self._missing, start_failed=True)
                self._next_start = time.monotonic() + self._backoff
                log.error(
                    "could not start a worker (%s: %s); %d missing, retrying in %.1f s",
                    type(exc).__name__,
                    exc,
                    self._missing,
                    self._backoff,
                )
                self._backoff = min(self._backoff * 2, RESTART_BACKOFF[1])
                break
            self._missing -= 1
            self._backoff = RESTART_BACKOFF[0]
            log.info("worker started again; %d missing", self._missing)
        self._service.note_workers(self._missing)

    def watch(self, control: Connection | None) -> WatchEnd:
        """Supervise until stopped; returns why: the owner's message (STOP, STOP_NOW), its
        going away (OWNER_GONE), or a stop by a call (STOP).

        Sleeps until a local worker exits, the owner writes or goes away, something calls
        ``wake_supervisor()`` (a hello, a lease with a timeout, stop), the earliest job
        timeout, or the earliest remote heartbeat deadline.
        """
        while not self._service.stopping.is_set():
            by_sentinel: dict[Any, str] = {w.proc.sentinel: i for i, w in self._workers.items()}
            waitables: list[Any] = [self._service.wake_reader, *by_sentinel]
            if control is not None:
                waitables.append(control)
            ready = wait(waitables, self._next_timeout())
            if control is not None and control in ready:
                reason = self._owner_message(control)
                if reason is not None:
                    return reason
            if self._service.wake_reader in ready:
                self._drain_wake()
            try:
                self._kill_expired()
                self._expire_remote()
                for sentinel in ready:
                    worker_id = by_sentinel.get(sentinel)
                    if worker_id is not None:
                        self._on_exit(worker_id)
                if not self._service.stopping.is_set():
                    self._restart_missing()
            except Exception:  # the supervisor must outlive its own bugs: futures depend on it
                log.exception("supervisor error; carrying on")
        return WatchEnd.STOP

    def _next_timeout(self) -> float | None:
        _, job_deadline = self._service.expired_leases()
        _, heartbeat_deadline = self._service.expired_remote()
        restart = self._next_start if self._missing else None
        deadlines = [d for d in (job_deadline, heartbeat_deadline, restart) if d is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _owner_message(self, control: Connection) -> WatchEnd | None:
        try:
            message = control.recv()
            return WatchEnd(message) if message in (STOP, STOP_NOW) else None
        except (EOFError, OSError):
            log.warning("the process that started this manager is gone; stopping")
            return WatchEnd.OWNER_GONE

    def _kill_expired(self) -> None:
        late, _ = self._service.expired_leases()
        for lease in late:
            local = self._workers.get(lease.worker_id)
            if local is None or self._killed.get(lease.worker_id) == lease.lease_id:
                continue  # remote workers enforce their jobs' timeouts themselves
            pid = local.proc.pid
            # Only while the lease is still in flight: the worker may have reported the
            # late job and taken the next one since expired() looked. Retired first, it
            # takes no other job while the kill runs (outside the queue's lock).
            if self._service.retire_for_kill(lease.worker_id, lease.lease_id):
                kill_tree(pid)
                self._killed[lease.worker_id] = lease.lease_id
                log.warning(
                    "job %s ran past its timeout; killed worker %s (pid %s)",
                    lease.job_id,
                    lease.worker_id,
                    pid,
                )

    def _expire_remote(self) -> None:
        late, _ = self._service.expired_remote()
        for worker_id in late:
            held = self._service.lose_worker(worker_id, exitcode=None)
            log.error(
                "remote worker %s missed its heartbeats; declared gone with %d job(s)",
                worker_id,
                held,
            )

    def _on_exit(self, worker_id: str) -> None:
        local = self._workers.pop(worker_id)
        self._killed.pop(worker_id, None)
        local.proc.join()
        exitcode = local.proc.exitcode
        self._claims.remove(worker_id)
        if local.slot.durable:  # it says which job it entered, and what it ran
            held = self._service.resolve_left(worker_id, exitcode, local.slot.left_behind())
        else:
            kept = local.slot.kept()
            if kept:  # reports of jobs it ran before the one it died in
                self._service.recover_reports(worker_id, kept)
            # Leases grow: every one of its leases up to the last it received or started
            # had reached it (an attempt); the later ones never did (prefetched, not
            # started).
            started = local.slot.started()
            held = self._service.lose_worker(
                worker_id, exitcode, received=lambda lease: lease.lease_id <= started
            )
        self._slots.release(local.slot)  # what it held is resolved: the slot may go again
        if held or exitcode != 0:
            log.error(
                "worker %s (pid %s) exited with code %s holding %d job(s)",
                worker_id,
                local.proc.pid,
                exitcode,
                held,
            )
        if not self._service.stopping.is_set():
            self._missing += 1  # replaced by _restart_missing(), with backoff on failure

    def kill_busy(self) -> int:
        """Kill the local workers that run a job, with their process trees (the owner
        asked for it: STOP_NOW); returns how many. The others leave as at any stop."""
        running = self._service.workers.busy()
        busy = [local for worker_id, local in self._workers.items() if worker_id in running]
        for local in busy:
            kill_tree(local.proc.pid)
        return len(busy)

    def stop_workers(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for local workers to leave, then kill their trees."""
        deadline = time.monotonic() + grace
        for local in self._workers.values():
            local.proc.join(max(0.0, deadline - time.monotonic()))
        for local in self._workers.values():
            if local.proc.is_alive():
                log.warning(
                    "worker pid %s did not stop in %.1f s; killing it", local.proc.pid, grace
                )
                kill_tree(local.proc.pid)
                local.proc.join(2.0)
        self._workers.clear()
        self._lifeline_w.close()
