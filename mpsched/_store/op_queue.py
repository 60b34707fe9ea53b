"""The ops queued for a store writer (:mod:`mpsched._store.writer`), the batch being formed
from them, and who holds the lead to write it: all under one mutex, never held while SQLite
works. The writer thread waits here for a batch of its own, or for housekeeping."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque

from mpsched._core.histogram import COMMIT_BOUNDS, Histogram, HistogramSnapshot
from mpsched._errors import StoreError
from mpsched._store.commit import Op

log = logging.getLogger("mpsched.store")

MAX_BACKOFF = 1.0  # seconds between retries of a batch that failed as a whole
# Seconds an asynchronous op may wait for a durable caller's batch to carry it before the
# writer thread writes it: long enough that a busy manager's finishes gather into few
# commits (2 ms cost ~20% more CPU per job here), short next to anything that reads them
# (a flush writes at once).
ASYNC_DELAY = 0.010


class OpQueue:
    """The queue of one writer's ops, the lead over its connection, and the writer thread's wait.

    Args:
        path: the store's file, named in errors and logs.
        batch_size: the most rows one batch holds.
        linger: seconds the writer thread waits after a batch's first op for ``batch_size``
            rows; with it, only the writer thread writes.
        idle: seconds the writer thread stays idle before its housekeeping.
    """

    def __init__(self, path: str, *, batch_size: int, linger: float, idle: float) -> None:
        self._path = path
        self._batch_size = batch_size
        self._linger = linger
        self._idle = idle
        # Written by the holder of the lead (the only caller of the writer's housekeeping);
        # read by the writer thread, with _mutex held, to choose how long it stays idle.
        self.housekeeping_left = False
        # Guards every field below. Held only to queue, take a batch, settle it and pass
        # the lead: never while SQLite works. Durable callers wait on their own op's
        # waiter, not on this.
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
        self._commit_seconds = Histogram(COMMIT_BOUNDS)  # each commit's time

    # ------------------------------------------------------------------ callers

    def put(self, op: Op) -> bool:
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

    def give_up(self, op: Op) -> None:
        """The caller of ``op`` was interrupted waiting: nobody is to wake it or hand it
        the lead (a lead it was handed goes on); the op is still written."""
        with self._mutex:
            if not op.settled:
                op.settled = True
                if op.lead:
                    self._pass_lead_locked()

    def close(self) -> bool:
        """Refuse new ops and wake the writer thread to write the rest and stop. False if
        closed already."""
        with self._mutex:
            if self._closed:
                return False
            self._closed = self._closing = True
            self._wake.notify()
        return True

    def commit_latency(self) -> HistogramSnapshot:
        """How long each transaction took to write and commit, so far."""
        with self._mutex:
            return self._commit_seconds.snapshot()

    def _callers_lead_locked(self) -> bool:
        """Whether durable callers may write batches (else the writer thread alone does)."""
        return not self._linger and not self._backoff and not self._closing

    # ------------------------------------------------------------------ the lead

    def take(self) -> list[Op]:
        """For the holder of the lead: the oldest queued ops, until they hold
        ``batch_size`` rows (an op is never split)."""
        with self._mutex:
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

    def settle(self, batch: list[Op], own: Op | None) -> bool | None:
        """Settle ``batch``'s durable ops, waking their callers but ``own``'s. None while
        the holder of the lead is to write on for ``own``; else the lead is passed on, and
        True when ``own`` is settled (None: the holder wrote one batch for nobody)."""
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
            return None

    def pass_lead(self) -> None:
        """Hand the lead on, as :meth:`_pass_lead_locked`."""
        with self._mutex:
            self._pass_lead_locked()

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
        if self._ops or self._closing or self.housekeeping_left:
            self._wake.notify()

    # ------------------------------------------------------------------ outcomes

    def committed(self, seconds: float) -> None:
        """A batch was committed in ``seconds``: a backoff, if any, ends."""
        with self._mutex:
            self._commit_seconds.observe(seconds)
            if self._backoff:
                log.warning("the job store %s takes writes again", self._path)
                self._backoff = 0.0

    def failed(self, retry: list[Op], exc: sqlite3.Error) -> None:
        """A batch failed as a whole: put its async ops ``retry`` back at the head, in
        order, after a backoff (unless the store is closing)."""
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

    def stop(self, batch: list[Op]) -> list[Op]:
        """A bug stopped the writer: refuse new ops, fail every unsettled op (``batch``'s
        and the queued ones), free the lead. Returns those ops."""
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
        return queued

    # ------------------------------------------------------------------ the thread

    def next_batch(self) -> bool | None:
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
                    more = self.housekeeping_left and not self._busy
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
