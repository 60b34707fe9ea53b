"""Group commit: queued ops applied to one SQLite connection, one commit per batch.

Callers hand in ops: a statement on one job (``call_update``, ``post_update``) or a function
of the connection (``call``, ``post``). A durable caller waits for the commit covering its
op; an asynchronous one returns at once. One thread at a time holds the *lead* and writes a
batch: every op queued so far, oldest first, up to ``batch_size`` rows.

- A durable caller that finds nobody writing takes the lead and writes in its own thread
  ("leader commits"): a lone caller pays its commit and no thread hand-off.
- One that finds a batch being written waits on its op's own lock. Whoever ends a batch
  wakes the callers it settled and hands the lead to the oldest durable caller still
  queued, who writes everything queued meanwhile (group commit).
- Asynchronous ops wake nobody: they ride in the next durable caller's batch, or the
  writer thread writes them ``ASYNC_DELAY`` after they came in.
- With ``linger > 0``, or during a backoff, only the writer thread writes (it waits up to
  ``linger`` for ``batch_size`` rows, or out the backoff).

Data flow::

    call(op) ──┐                       the lead: a durable caller, or the writer thread
    call(op) ──┼─▶ queue ─▶ batch ─▶ BEGIN; ops ...; COMMIT ─▶ settle callers, pass the lead
    post(op) ──┘     ▲                      │ disk full, I/O error: ROLLBACK
                     └──── async ops, in order, after a backoff ◀──┘  (durable callers fail)

How one batch is written and committed (statements grouped, functions in savepoints, a
replay op by op when a statement breaks a rule) is :mod:`mpsched._store.commit`'s; the queue,
the batch being formed, the lead and the writer thread's wait are
:mod:`mpsched._store.op_queue`'s; here, the callers' ops, the holder of the lead writing
batches, and the thread.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpsched._core.histogram import HistogramSnapshot
from mpsched._store.commit import Committer, Op, translate
from mpsched._store.op_queue import OpQueue

log = logging.getLogger("mpsched.store")


def _nothing(conn: sqlite3.Connection) -> None:
    """A flush's op: it changes nothing, its commit covers every earlier op."""


class Writer:
    """One connection's ops: callers queue them, the holder of the lead writes them."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        *,
        batch_size: int,
        linger: float,
        idle: float,
        housekeeping: Callable[[sqlite3.Connection], bool],
        multi: Mapping[str, Callable[[int], str]] | None = None,
    ) -> None:
        # Used only by the holder of the lead, once started.
        self._committer = Committer(conn, path, multi or {})
        self._path = path
        self._batch_size = batch_size
        # Run before every batch and when the writer thread is idle for ``idle`` seconds;
        # True: it has more to do, and the idle writer thread runs it again at once.
        self._housekeeping = housekeeping
        self._queue = OpQueue(path, batch_size=batch_size, linger=linger, idle=idle)
        self._thread = threading.Thread(target=self._run, name="mpsched-store-writer", daemon=True)
        self._thread.start()

    @property
    def commits(self) -> int:
        """Transactions committed so far."""
        return self._committer.commits

    # ------------------------------------------------------------------ callers

    def commit_latency(self) -> HistogramSnapshot:
        """How long each transaction took to write and commit (fsync included), so far."""
        return self._queue.commit_latency()

    def call(self, apply: Callable[[sqlite3.Connection], Any], rows: int = 1) -> Any:
        """Queue ``apply`` and wait until it is committed; its result, or its error."""
        return self._call(Op(apply, "", (), None, rows, durable=True))

    def post(self, apply: Callable[[sqlite3.Connection], object], rows: int = 1) -> None:
        """Queue ``apply`` to run after every op queued before it; return at once."""
        self._queue.put(Op(apply, "", (), None, rows, durable=False))

    def call_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """Run ``sql`` (it changes the row of ``job_id`` only) and wait for its commit."""
        self._call(Op(None, sql, params, job_id, 1, durable=True))

    def post_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """As ``call_update``, returning at once: written after every earlier op."""
        self._queue.put(Op(None, sql, params, job_id, 1, durable=False))

    def flush(self) -> None:
        """Wait until every op queued before this call is settled. A flush fills the batch
        it ends: with ``linger``, the writer does not wait for more rows after it (a store
        that closes would wait out the linger)."""
        self._call(Op(_nothing, "", (), None, self._batch_size, durable=True))

    def close(self) -> bool:
        """Write what is queued, stop the thread, close the connection. False if closed."""
        if not self._queue.close():
            return False
        self._thread.join()
        self._committer.close()
        return True

    def _call(self, op: Op) -> Any:
        lead = self._queue.put(op)
        while True:
            if not lead:
                self._await(op)
            if op.settled or self._lead(op):
                break
            lead = False  # the lead was given up to a backoff: wait for the writer thread
        if op.error is not None:
            raise op.error
        return op.result

    def _await(self, op: Op) -> None:
        """Block until ``op`` is settled or its caller is handed the lead."""
        assert op.waiter is not None
        try:
            op.waiter.acquire()
        except BaseException:  # interrupted (the main thread): the op is still written
            self._queue.give_up(op)
            raise

    # ------------------------------------------------------------------ the lead

    def _lead(self, own: Op | None) -> bool:
        """Holding the lead, write batches until ``own`` is settled (None: one batch), then
        pass the lead on; True. False when a failed batch started a backoff before ``own``
        was written: the lead went to the writer thread and ``own``'s caller waits again."""
        while True:
            batch = self._queue.take()
            try:
                self._write(batch)
            except BaseException as exc:  # a bug: every caller must still hear of it
                self._stop(batch, exc)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                return True
            passed = self._queue.settle(batch, own)
            if passed is not None:
                return passed

    def _write(self, batch: list[Op]) -> None:
        """Apply ``batch`` in one transaction; on failure, ops are settled by ``_undo``."""
        self._queue.housekeeping_left = self._housekeeping(self._committer.conn)
        began = time.monotonic()
        failed = self._committer.commit(batch)
        if failed is not None:
            self._undo(batch, failed)
            return
        for op in batch:
            if op.waiter is None and op.error is not None:
                log.error("a change to the job store %s was refused: %s", self._path, op.error)
        self._queue.committed(time.monotonic() - began)

    def _undo(self, batch: list[Op], exc: sqlite3.Error) -> None:
        """The batch failed as a whole (rolled back): fail its durable ops, keep its async
        ones in order."""
        retry: list[Op] = []
        for op in batch:
            if op.waiter is not None:
                op.error = op.error or translate(exc, self._path)
            elif op.error is None:
                retry.append(op)
        self._queue.failed(retry, exc)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while (write := self._queue.next_batch()) is not None:
                if write:
                    self._lead(None)
                else:
                    self._queue.housekeeping_left = self._housekeeping(self._committer.conn)
                    self._queue.pass_lead()
        except BaseException as exc:  # a bug: callers must still hear of it
            self._stop([], exc)

    def _stop(self, batch: list[Op], exc: BaseException) -> None:
        """A bug stopped a batch: refuse new ops, fail every unsettled op, free the lead."""
        log.error("the writer of the job store %s stopped", self._path, exc_info=exc)
        self._committer.rollback()
        queued = self._queue.stop(batch)
        if any(op.waiter is None and op.error is None for op in queued):
            log.error("the writer of the job store %s stopped with changes not written", self._path)
