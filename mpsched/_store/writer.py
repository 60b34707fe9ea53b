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
replay op by op when a statement breaks a rule) is :mod:`mpsched._store.commit`'s; here,
who writes which batch when.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpsched._core.histogram import COMMIT_BOUNDS, Histogram, HistogramSnapshot
from mpsched._errors import StoreError
from mpsched._store.commit import Committer, Op, translate

log = logging.getLogger("mpsched.store")

MAX_BACKOFF = 1.0  # seconds between retries of a batch that failed as a whole
# Seconds an asynchronous op may wait for a durable caller's batch to carry it before the
# writer thread writes it: long enough that a busy manager's finishes gather into few
# commits (2 ms cost ~20% more CPU per job here), short next to anything that reads them
# (a flush writes at once).
ASYNC_DELAY = 0.010


def _nothing(conn: sqlite3.Connection) -> None:
    """A flush's op: it changes nothing, its commit covers every earlier op."""


class Writer:
    """The queue of one connection's ops, its lead, and the writer thread."""

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
        self._linger = linger
        self._idle = idle
        # Run before every batch and when the writer thread is idle for ``idle`` seconds;
        # True: it has more to do, and the idle writer thread runs it again at once.
        self._housekeeping = housekeeping
        # Written by the holder of the lead (the only caller of _housekeeping); read by
        # the writer thread, with _mutex held, to choose how long it stays idle.
        self._housekeeping_left = False
        # Guards every field below except commits. Held only to queue, take a batch, settle
        # it and pass the lead: never while SQLite works. Durable callers wait on their own
        # op's waiter, not on this.
        self._mutex = threading.Lock()
        # On _mutex. The writer thread waits on it while _writer_idle (nothing queued, or
        # a batch in someone else's hands), or for a deadline (linger, backoff,
        # ASYNC_DELAY); notified when an op comes in while it is idle, when a batch ends
        # leaving ops or housekeeping for it, and by close().
        self._wake = threading.Condition(self._mutex)
        self._ops: deque[Op] = deque()
        self._durable: deque[Op] = deque()  # the durable ops of _ops, in the same order
        self._rows = 0  # queued rows: a batch is written at batch_size
        self._first_at = 0.0  # time.monotonic() when the oldest queued op came in
        self._busy = False  # a thread holds the lead: it alone uses the connection
        self._writer_idle = False  # the writer thread needs a notify to look again
        self._backoff = 0.0  # > 0 while a failed batch's async ops wait to be retried
        self._closing = False  # no more ops: close() was called, or the writer stopped
        self._closed = False  # close() was called
        self._commit_seconds = Histogram(COMMIT_BOUNDS)  # each commit's time; on _mutex
        self._thread = threading.Thread(target=self._run, name="mpsched-store-writer", daemon=True)
        self._thread.start()

    @property
    def commits(self) -> int:
        """Transactions committed so far."""
        return self._committer.commits

    # ------------------------------------------------------------------ callers

    def commit_latency(self) -> HistogramSnapshot:
        """How long each transaction took to write and commit (fsync included), so far."""
        with self._mutex:
            return self._commit_seconds.snapshot()

    def call(self, apply: Callable[[sqlite3.Connection], Any], rows: int = 1) -> Any:
        """Queue ``apply`` and wait until it is committed; its result, or its error."""
        return self._call(Op(apply, "", (), None, rows, durable=True))

    def post(self, apply: Callable[[sqlite3.Connection], object], rows: int = 1) -> None:
        """Queue ``apply`` to run after every op queued before it; return at once."""
        self._put(Op(apply, "", (), None, rows, durable=False))

    def call_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """Run ``sql`` (it changes the row of ``job_id`` only) and wait for its commit."""
        self._call(Op(None, sql, params, job_id, 1, durable=True))

    def post_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """As ``call_update``, returning at once: written after every earlier op."""
        self._put(Op(None, sql, params, job_id, 1, durable=False))

    def flush(self) -> None:
        """Wait until every op queued before this call is settled. A flush fills the batch
        it ends: with ``linger``, the writer does not wait for more rows after it (a store
        that closes would wait out the linger)."""
        self._call(Op(_nothing, "", (), None, self._batch_size, durable=True))

    def close(self) -> bool:
        """Write what is queued, stop the thread, close the connection. False if closed."""
        with self._mutex:
            if self._closed:
                return False
            self._closed = self._closing = True
            self._wake.notify()
        self._thread.join()
        self._committer.close()
        return True

    def _call(self, op: Op) -> Any:
        lead = self._put(op)
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
            with self._mutex:
                if not op.settled:
                    op.settled = True  # nobody is to wake its caller or hand it the lead
                    if op.lead:
                        self._pass_lead_locked()
            raise

    def _put(self, op: Op) -> bool:
        """Queue ``op``; True when its (durable) caller is to take the lead at once."""
        with self._mutex:
            if self._closing:
                raise StoreError(self._path, "the store is closed")
            if not self._ops:
                self._first_at = time.monotonic()
            before = self._rows
            self._ops.append(op)
            self._rows += op.rows
            callers_lead = self._callers_lead_locked()
            if op.waiter is not None:
                self._durable.append(op)
                if callers_lead:
                    if self._busy:
                        return False  # the holder of the lead hands it on
                    self._busy = True
                    return True
            if (self._writer_idle and not self._busy) or before < self._batch_size <= self._rows:
                self._wake.notify()
            return False

    def _callers_lead_locked(self) -> bool:
        """Whether durable callers may write batches (else the writer thread alone does)."""
        return not self._linger and not self._backoff and not self._closing

    # ------------------------------------------------------------------ the lead

    def _lead(self, own: Op | None) -> bool:
        """Holding the lead, write batches until ``own`` is settled (None: one batch), then
        pass the lead on; True. False when a failed batch started a backoff before ``own``
        was written: the lead went to the writer thread and ``own``'s caller waits again."""
        while True:
            with self._mutex:
                batch = self._take_locked()
            try:
                self._write(batch)
            except BaseException as exc:  # a bug: every caller must still hear of it
                self._stop(batch, exc)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                return True
            with self._mutex:
                for op in batch:
                    if op.waiter is not None and not op.settled:
                        op.settled = True
                        if op is not own:
                            op.waiter.release()
                if own is None or own.settled or not self._callers_lead_locked():
                    if own is not None:
                        own.lead = False
                    self._pass_lead_locked()
                    return own is None or own.settled

    def _pass_lead_locked(self) -> None:
        """Hand the lead to the oldest durable caller still queued, else let it go."""
        durable = self._durable
        while durable and durable[0].settled:
            durable.popleft()  # its caller was interrupted: it is written all the same
        if durable and self._callers_lead_locked():
            nxt = durable[0]
            nxt.lead = True
            assert nxt.waiter is not None
            nxt.waiter.release()
            return
        self._busy = False
        if self._ops or self._closing or self._housekeeping_left:
            self._wake.notify()

    def _take_locked(self) -> list[Op]:
        """The oldest queued ops, until they hold ``batch_size`` rows (an op is never split)."""
        ops, durable = self._ops, self._durable
        batch = [ops.popleft()]
        rows = batch[0].rows
        while ops and rows < self._batch_size:
            op = ops.popleft()
            batch.append(op)
            rows += op.rows
        self._rows -= rows
        for op in batch:
            if op.waiter is not None and durable and durable[0] is op:
                durable.popleft()
        return batch

    # ------------------------------------------------------------------ writing

    def _write(self, batch: list[Op]) -> None:
        """Apply ``batch`` in one transaction; on failure, ops are settled by ``_undo``."""
        self._housekeeping_left = self._housekeeping(self._committer.conn)
        began = time.monotonic()
        failed = self._committer.commit(batch)
        if failed is not None:
            self._undo(batch, failed)
            return
        for op in batch:
            if op.waiter is None and op.error is not None:
                log.error("a change to the job store %s was refused: %s", self._path, op.error)
        with self._mutex:
            self._commit_seconds.observe(time.monotonic() - began)
            if self._backoff:
                log.warning("the job store %s takes writes again", self._path)
                self._backoff = 0.0

    def _undo(self, batch: list[Op], exc: sqlite3.Error) -> None:
        """The batch failed as a whole (rolled back): fail its durable ops, keep its async
        ones in order."""
        retry: list[Op] = []
        for op in batch:
            if op.waiter is not None:
                op.error = op.error or translate(exc, self._path)
            elif op.error is None:
                retry.append(op)
        with self._mutex:
            if retry and self._closing:
                log.error(
                    "the job store %s is closing and %d changes could not be written: %s",
                    self._path,
                    len(retry),
                    exc,
                )
                return
            if retry and not self._backoff:
                log.warning(
                    "writes to the job store %s fail (%s); retrying %d changes",
                    self._path,
                    exc,
                    len(retry),
                )
            self._backoff = min(MAX_BACKOFF, max(0.01, 2 * self._backoff)) if retry else 0.0
            if retry:
                self._ops.extendleft(reversed(retry))
                self._rows += sum(op.rows for op in retry)
                self._first_at = time.monotonic()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while (write := self._next_batch()) is not None:
                if write:
                    self._lead(None)
                else:
                    self._housekeeping_left = self._housekeeping(self._committer.conn)
                    with self._mutex:
                        self._pass_lead_locked()
        except BaseException as exc:  # a bug: callers must still hear of it
            self._stop([], exc)

    def _next_batch(self) -> bool | None:
        """Wait until the writer thread is to write a batch (True) or, idle for a while (at
        once while housekeeping has more to do), to do its housekeeping (False), holding
        the lead either way; None: it stops."""
        watch = False  # woken by an op: look again after ASYNC_DELAY before going idle
        with self._mutex:
            while True:
                if self._busy or not self._ops:
                    if not self._busy and self._closing:
                        return None
                    if watch:  # more ops are likely: spare their callers a notify each
                        watch = False
                        self._wake.wait(ASYNC_DELAY)
                        continue
                    self._writer_idle = True
                    more = self._housekeeping_left and not self._busy
                    watch = self._wake.wait(0.0 if more else self._idle)
                    self._writer_idle = False
                    if not watch and not self._busy and not self._ops:
                        self._busy = True
                        return False
                    continue
                watch = True
                if self._backoff:
                    wait = self._backoff
                elif self._durable:  # their callers wait for the writer thread
                    wait = self._linger
                else:
                    wait = max(self._linger, ASYNC_DELAY)
                remaining = self._first_at + wait - time.monotonic()
                full = not self._backoff and self._rows >= self._batch_size
                if remaining <= 0 or full or self._closing:
                    self._busy = True
                    return True
                self._wake.wait(remaining)

    def _stop(self, batch: list[Op], exc: BaseException) -> None:
        """A bug stopped a batch: refuse new ops, fail every unsettled op, free the lead."""
        log.error("the writer of the job store %s stopped", self._path, exc_info=exc)
        self._committer.rollback()
        with self._mutex:
            self._closing = True
            queued, self._ops = [*batch, *self._ops], deque()
            self._durable.clear()
            self._rows = 0
            self._busy = False
            for op in queued:
                if op.waiter is not None and not op.settled:
                    op.error = StoreError(self._path, "the store's writer stopped")
                    op.settled = True
                    op.waiter.release()
            self._wake.notify()
        if any(op.waiter is None and op.error is None for op in queued):
            log.error("the writer of the job store %s stopped with changes not written", self._path)
