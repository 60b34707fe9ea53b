"""The pool of ``python -m mpsched worker``: it keeps ``processes`` remote worker processes
(mpsched._worker.remote).

The pool (``WorkerPool``) keeps ``processes`` workers: it starts another whenever one exits
while the pool is not draining, whatever its exit code (a job may call ``os._exit(0)``, or
``os._exit(3)``). A worker that exits on purpose first says why in a shared slot, its
verdict, so a job's exit code can never pass for one: a refused key or version stops every
worker (the pool exits AUTH or VERSION), as does an unreachable manager at the first start
(UNREACHABLE; the CLI probes first; a busy one is waited for). A manager that stops or
dies is waited for: its workers join it again when it is back. A manager that dismisses
a worker (``drain-workers``, or its stop with ``--drain-workers-on-stop``) drains the pool,
which exits 0. First SIGTERM or SIGINT: every worker drains (finishes its job, takes no
more) and the pool exits 0. Second: the workers are killed.

Each worker tells the pool, over a pipe of its own, the id it joined the manager under.
When a worker that joined dies without a word (a job's ``os._exit``, a signal), the pool
tells the manager at once, with the exit code or signal, and the manager resolves the jobs
it held as it does a local worker's (``ManagerService.worker_exited``); when the manager
cannot be reached just then, the worker's missed heartbeats remain the fallback. A worker
that dies before it joined is started again after a back-off, as the manager's supervisor
does (0.1 s doubling to 10 s, one warning per streak), until one joins.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mpsched._errors import AuthenticationError, VersionMismatchError
from mpsched._protocol.proxy import connect_service
from mpsched._protocol.records import Exit, LeftBehind
from mpsched._transport.address import format_address
from mpsched._transport.sockets import host_name
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.pool_slots import Orphan, PoolSlots, forget
from mpsched._worker.process import WorkerConfig
from mpsched._worker.remote import remote_worker_main
from mpsched._worker.stop_reasons import LoopEnd

log = logging.getLogger("mpsched.remote")

# A worker that dies before it joined is started again after this many seconds, doubling
# with each one that does up to the second value; a worker that joins resets it.
RESTART_BACKOFF = (0.1, 10.0)
# At its exit, how long the pool waits for its last reports of dead workers to the manager.
REPORT_GRACE = 2.0


class _Verdict(enum.IntEnum):
    """Why a worker process exited, as it says in its shared slot just before."""

    UNSAID = 0  # nothing said: a job's os._exit, a crash, a signal, a job timeout
    LEFT = 1  # drained or recycled
    DISMISSED = 2  # by the manager: the pool leaves
    AUTH = Exit.AUTH  # the fatal ones: the pool stops and exits with the same code
    VERSION = Exit.VERSION
    UNREACHABLE = Exit.UNREACHABLE


FATAL = {_Verdict.AUTH, _Verdict.VERSION, _Verdict.UNREACHABLE}


def _child(
    config: WorkerConfig, lifeline: Connection, verdict: Any, joins: Connection, slot: ClaimSlot
) -> None:
    config = replace(config, worker_id=f"{host_name()}:{os.getpid()}")

    def joined(worker_id: str) -> None:
        with contextlib.suppress(OSError):  # the pool is gone: the lifeline ends us
            joins.send(worker_id)

    said = _Verdict.LEFT
    try:
        if remote_worker_main(config, lifeline, joined, slot) == LoopEnd.DISMISSED:
            said = _Verdict.DISMISSED
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


def _tell_manager(
    config: WorkerConfig,
    gone: list[tuple[str, int | None, LeftBehind | None]],
    orphan: Orphan | None = None,
) -> None:
    """Tell the manager, in a thread of the pool's, that each ``(worker id, exit code,
    what its slot says)`` of ``gone`` is gone; then ``orphan`` (whose slots they are) is
    forgotten."""
    try:
        service = connect_service(config.address, config.authkey)
        for worker_id, exitcode, left in gone:
            service.worker_exited(worker_id, exitcode, left)
    except Exception as exc:  # whatever it is, the heartbeat deadline still comes
        log.warning(
            "could not tell the manager at %s that worker(s) %s are gone (%s: %s); "
            "it will notice when their heartbeats stop",
            format_address(config.address),
            ", ".join(w for w, _, _ in gone),
            type(exc).__name__,
            exc,
        )
        return
    if orphan is not None:
        log.info(
            "told the manager what %d worker(s) of a pool that died had left in %s",
            len(gone),
            orphan.path,
        )
        forget(orphan)


@dataclass(eq=False)
class _PoolWorker:
    proc: BaseProcess
    slot: ClaimSlot  # what it entered and ran, under the id it joined with (pool_slots)
    verdict: Any  # shared int: a _Verdict the process sets before it exits on purpose
    joins: Connection | None  # the ids it joins under arrive here; None once it closed
    worker_id: str | None = None  # the id it last joined under; None: it never joined


class WorkerPool:
    """The parent of ``processes`` remote worker processes."""

    def __init__(self, config: WorkerConfig, processes: int, method: str) -> None:
        self._config = config
        self._processes = processes
        self._ctx: Any = multiprocessing.get_context(method)
        # Children exit when this process dies: only it holds the write end.
        self._lifeline_r, self._lifeline_w = self._ctx.Pipe(duplex=False)
        self._slots = PoolSlots(config.address)
        # Everything below is touched by the main thread only.
        self._workers: list[_PoolWorker] = []
        self._draining = False  # no more replacements: a signal, a fatal or a stop
        self._signals = 0
        self._killed_by = 0  # the signal that made us kill the workers (the second one)
        self._missing = 0  # workers to start again, once _next_start has come
        self._next_start = 0.0  # monotonic time
        self._backoff = RESTART_BACKOFF[0]  # the wait after the next worker dying at start
        self._failed_starts = 0  # workers that died before they joined, since one joined
        self._reporters: list[threading.Thread] = []  # telling the manager of a death
        # The signal handler writes here, so that a wait for the next start ends at once.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def run(self) -> int:
        """Run until every worker has left; returns the pool's exit code."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for _ in range(self._processes):
            self._start(patient=False)
        result = Exit.OK
        while self._workers or self._missing:
            joins = {w.joins: w for w in self._workers if w.joins is not None}
            ready = wait(
                [self._wake_r, *joins, *(w.proc.sentinel for w in self._workers)],
                self._start_delay(),
            )
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            for conn in ready:
                if conn in joins:
                    self._read_joins(joins[conn])
            for worker in [w for w in self._workers if w.proc.sentinel in ready]:
                worker.proc.join()
                self._read_joins(worker)  # it may have joined just before it exited
                self._workers.remove(worker)
                result = self._on_exit(worker, result)
            self._start_missing()
        self._lifeline_w.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        deadline = time.monotonic() + REPORT_GRACE
        for reporter in self._reporters:
            reporter.join(max(0.0, deadline - time.monotonic()))
        self._slots.close()
        if self._killed_by:
            return 128 + self._killed_by  # as a process killed by that signal would
        return int(result)

    def _read_joins(self, worker: _PoolWorker) -> None:
        """Note the ids a worker said it joined under; close its pipe at its end."""
        if worker.joins is None:
            return
        joined = False
        try:
            while worker.joins.poll():
                worker.worker_id, joined = worker.joins.recv(), True
        except (EOFError, OSError):
            worker.joins.close()
            worker.joins = None
        if joined and self._slots.orphans:  # the manager answers: tell it what they left
            for orphan in self._slots.orphans:
                self._tell([(w, None, left) for w, left in orphan.left.items()], orphan)
            self._slots.orphans = []
        if joined and self._failed_starts:
            log.info(
                "worker pid %s joined the manager after %d worker(s) died at start",
                worker.proc.pid,
                self._failed_starts,
            )
            self._failed_starts = 0
            self._backoff = RESTART_BACKOFF[0]

    def _on_exit(self, worker: _PoolWorker, result: Exit) -> Exit:
        """Replace a worker that left, unless it says the pool must stop; returns the code."""
        said, code = worker.verdict.value, worker.proc.exitcode
        if said == _Verdict.UNSAID and worker.worker_id is not None:
            self._report_exit(worker, code)
        self._slots.release(worker.slot)
        if said in FATAL:
            self._drain()
            return Exit(said) if result == Exit.OK else result
        if said == _Verdict.DISMISSED:
            if not self._draining:
                log.warning(
                    "the manager at %s dismissed this pool: its workers finish their "
                    "jobs and it exits",
                    format_address(self._config.address),
                )
            self._drain()
            return result
        if not self._draining:
            self._replace(worker, said, code)
        return result

    def _replace(self, worker: _PoolWorker, said: int, code: int | None) -> None:
        """Start another worker in place of one that exited: at once, or after the
        back-off if it died before it ever joined."""
        pid = worker.proc.pid
        if said != _Verdict.UNSAID:
            log.info("worker pid %s left; starting another", pid)
        elif worker.worker_id is not None:
            log.warning("worker pid %s exited with %s; starting another", pid, code)
        else:
            self._died_at_start(f"worker pid {pid} exited with {code}")
        self._missing += 1  # started by _start_missing(), when _next_start has come

    def _died_at_start(self, what: str) -> None:
        """A worker died before it joined: the next start waits out the back-off."""
        self._failed_starts += 1
        if self._failed_starts == 1:  # once per streak, however long it lasts
            log.warning(
                "%s before it joined the manager; starting another in %g s, "
                "waiting twice as long (up to %g s) each time one dies so again",
                what,
                self._backoff,
                RESTART_BACKOFF[1],
            )
        self._next_start = max(self._next_start, time.monotonic() + self._backoff)
        self._backoff = min(self._backoff * 2, RESTART_BACKOFF[1])

    def _start_delay(self) -> float | None:
        """How long the pool may wait before a replacement is due (None: none is)."""
        if not self._missing:
            return None
        return max(0.0, self._next_start - time.monotonic())

    def _start_missing(self) -> None:
        while self._missing and not self._draining and time.monotonic() >= self._next_start:
            self._missing -= 1
            # It replaces a worker: if the manager is away just now, it waits for it
            # rather than stopping the pool.
            self._start(patient=True)

    def _start(self, *, patient: bool) -> None:
        """Start one worker process (``patient``: it waits for an unreachable manager)."""
        verdict = self._ctx.RawValue("i", _Verdict.UNSAID)
        joins, theirs = self._ctx.Pipe(duplex=False)
        config = replace(self._config, wait_for_manager=patient)
        slot = self._slots.slot(self._ctx)
        proc = self._ctx.Process(
            target=_child,
            args=(config, self._lifeline_r, verdict, theirs, slot),
            name="mpsched-remote-worker",
        )
        try:
            proc.start()
        except BrokenPipeError:
            # The new process died before it read what to run (killed as it was forked:
            # the OOM killer, a fork handler), so the pipe its start writes to is closed.
            joins.close()
            self._slots.release(slot)
            self._died_at_start("a new worker process died as it started (broken pipe)")
            self._missing += 1
            return
        except BaseException:
            joins.close()
            self._slots.release(slot)
            raise
        finally:
            theirs.close()  # the child's now: its death shows here as the end of the pipe
        self._workers.append(_PoolWorker(proc, slot, verdict, joins))

    def _report_exit(self, worker: _PoolWorker, exitcode: int | None) -> None:
        """Tell the manager that a worker that joined died without a word, and what its slot
        says it left: the manager resolves its jobs at once, not at its heartbeat
        deadline."""
        assert worker.worker_id is not None
        left: LeftBehind | None = worker.slot.left_behind()
        owner = worker.slot.owner()
        gone: list[tuple[str, int | None, LeftBehind | None]] = []
        if owner and owner != worker.worker_id and left is not None:
            # It died before it told what its session before left: that first.
            gone.append((owner, None, LeftBehind(b"", left.ended)))
            left = None  # it entered nothing as its new self
        gone.append((worker.worker_id, exitcode, left))
        self._tell(gone)

    def _tell(
        self, gone: list[tuple[str, int | None, LeftBehind | None]], orphan: Orphan | None = None
    ) -> None:
        self._reporters = [r for r in self._reporters if r.is_alive()]
        reporter = threading.Thread(
            target=_tell_manager,
            args=(self._config, gone, orphan),
            name="mpsched-exit-report",
            daemon=True,
        )
        reporter.start()
        self._reporters.append(reporter)

    def _drain(self) -> None:
        self._missing = 0
        if not self._draining:
            self._draining = True
            self._signal_all(signal.SIGTERM)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        with contextlib.suppress(BlockingIOError):  # full: the loop wakes anyway
            os.write(self._wake_w, b"x")
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
