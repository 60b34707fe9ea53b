"""Group commit: one thread applies queued ops to an SQLite connection, one commit per batch.

Callers hand in ops (a function of the connection); a durable caller waits for the commit
covering its op, an asynchronous one returns at once. The writer takes a batch as soon as it
is free: every op queued while it was committing the last one, up to ``batch_size`` rows, so
concurrent callers share one commit and a lone caller waits for one commit only. With
``linger > 0`` it first waits up to that long after a batch's first op for ``batch_size``
rows (fewer, bigger commits, each caller waiting longer). Data flow::

    call(op) ──┐                     writer thread
    call(op) ──┼─▶ queue ─▶ batch ─▶ BEGIN; SAVEPOINT/op/RELEASE ...; COMMIT ─▶ wake callers
    post(op) ──┘     ▲                      │ disk full, I/O error: ROLLBACK
                     └──── async ops, in order, after a backoff ◀──┘  (durable callers fail)
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from mpsched._errors import InvalidJobError, MpschedError, StoreError, StoreFullError

log = logging.getLogger("mpsched.store")

T = TypeVar("T")

MAX_BACKOFF = 1.0  # seconds between retries of a batch that failed as a whole


def translate(exc: BaseException, path: str) -> StoreError:
    """The typed error, naming ``path``, for an sqlite3 error."""
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" \
            or "database or disk is full" in str(exc):
        return StoreFullError(path)
    return StoreError(path, str(exc))


def _fails_batch(exc: BaseException, conn: sqlite3.Connection) -> bool:
    """True for errors of the store rather than of one op: full, I/O, busy, corrupt."""
    return not conn.in_transaction or isinstance(exc, sqlite3.OperationalError) \
        or type(exc) is sqlite3.DatabaseError


class _Op(Generic[T]):
    """One queued change: ``apply`` runs in the writer thread inside the batch."""

    __slots__ = ("apply", "done", "error", "result", "rows")

    def __init__(self, apply: Callable[[sqlite3.Connection], T], rows: int,
                 durable: bool) -> None:
        self.apply = apply
        self.rows = rows  # how much of a batch it fills
        # Set by the writer once the op is committed or failed; its caller waits on it.
        self.done = threading.Event() if durable else None
        self.result: T | None = None
        self.error: MpschedError | None = None

    def wait(self) -> T:
        assert self.done is not None
        self.done.wait()
        if self.error is not None:
            raise self.error
        return cast(T, self.result)


def check_batching(batch_size: int, linger: float, idle: float) -> None:
    """Raise InvalidJobError unless the writer's options are in range."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidJobError(f"batch_size must be a positive int, not {batch_size!r}")
    if not 0 <= linger <= 10:
        raise InvalidJobError(f"linger must be a number of seconds in [0, 10], not {linger!r}")
    if not 0 < idle < float("inf"):
        raise InvalidJobError(f"prune_interval must be a positive number, not {idle!r}")


class Writer:
    """The writer thread of one connection, and the queue it takes batches from."""

    def __init__(self, conn: sqlite3.Connection, path: str, *, batch_size: int,
                 linger: float, idle: float,
                 housekeeping: Callable[[sqlite3.Connection], None]) -> None:
        self._conn = conn  # used by the writer thread only, once started
        self._path = path
        self._batch_size = batch_size
        self._linger = linger
        self._idle = idle
        self._housekeeping = housekeeping
        # Guards _ops, _rows, _first_at, _backoff, _closing and _closed. The writer thread
        # waits on it for a first op (then, with a linger or a backoff, for the batch to fill
        # or the time to end); callers notify.
        self._cond = threading.Condition()
        self._ops: deque[_Op[Any]] = deque()
        self._rows = 0  # queued rows: a batch is written at batch_size
        self._first_at = 0.0  # time.monotonic() when the oldest queued op came in
        self._backoff = 0.0  # > 0 while a failed batch's async ops wait to be retried
        self._closing = False  # no more ops: close() was called, or the thread ended
        self._closed = False  # close() was called
        self.commits = 0  # written by the writer thread only
        self._thread = threading.Thread(target=self._run, name="mpsched-store-writer",
                                        daemon=True)
        self._thread.start()

    def call(self, apply: Callable[[sqlite3.Connection], T], rows: int = 1) -> T:
        """Queue ``apply`` and wait until it is committed; its result, or its error."""
        op = _Op(apply, rows, durable=True)
        self._put(op)
        return op.wait()

    def post(self, apply: Callable[[sqlite3.Connection], object], rows: int = 1) -> None:
        """Queue ``apply`` to run after every op queued before it; return at once."""
        self._put(_Op(apply, rows, durable=False))

    def close(self) -> bool:
        """Write what is queued, stop the thread, close the connection. False if closed."""
        with self._cond:
            if self._closed:
                return False
            self._closed = self._closing = True
            self._cond.notify()
        self._thread.join()
        self._conn.close()
        return True

    def _put(self, op: _Op[Any]) -> None:
        with self._cond:
            if self._closing:
                raise StoreError(self._path, "the store is closed")
            if not self._ops:
                self._first_at = time.monotonic()
                self._cond.notify()
            before = self._rows
            self._ops.append(op)
            self._rows += op.rows
            if before < self._batch_size <= self._rows:
                self._cond.notify()

    def _run(self) -> None:
        batch: list[_Op[Any]] | None = []
        try:
            while (batch := self._next_batch()) is not None:
                self._housekeeping(self._conn)
                if batch:
                    self._write(batch)
        except BaseException:  # a bug: callers must still hear of it (see _abandon)
            log.exception("the writer of the job store %s stopped", self._path)
        finally:
            self._abandon(batch or [])

    def _next_batch(self) -> list[_Op[Any]] | None:
        """The ops to write next; [] when idle for a while (housekeeping); None to stop."""
        with self._cond:
            if not self._ops and not self._closing:
                self._cond.wait(self._idle)
                if not self._ops and not self._closing:
                    return []
            if not self._ops:
                return None
            deadline = self._first_at + max(self._linger, self._backoff)
            while not self._closing and (self._backoff or self._rows < self._batch_size):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._take_locked()

    def _take_locked(self) -> list[_Op[Any]]:
        """The oldest queued ops, until they hold ``batch_size`` rows (an op is never split)."""
        batch = [self._ops.popleft()]
        rows = batch[0].rows
        while self._ops and rows < self._batch_size:
            op = self._ops.popleft()
            batch.append(op)
            rows += op.rows
        self._rows -= rows
        return batch

    def _write(self, batch: list[_Op[Any]]) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in batch:
                self._apply(op)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._undo(batch, exc)
            return
        self.commits += 1
        for op in batch:
            if op.done is not None:
                op.done.set()
            elif op.error is not None:
                log.error("a change to the job store %s was refused: %s", self._path, op.error)
        with self._cond:
            if self._backoff:
                log.warning("the job store %s takes writes again", self._path)
            self._backoff = 0.0

    def _apply(self, op: _Op[Any]) -> None:
        """Run one op in a savepoint: an op that breaks a rule fails alone."""
        conn = self._conn
        conn.execute("SAVEPOINT op")
        try:
            op.result = op.apply(conn)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and _fails_batch(exc, conn):
                raise
            conn.execute("ROLLBACK TO op")
            if isinstance(exc, MpschedError):
                op.error = exc
            else:
                log.exception("a change to the job store %s failed", self._path)
                op.error = translate(exc, self._path)
        conn.execute("RELEASE op")

    def _undo(self, batch: list[_Op[Any]], exc: sqlite3.Error) -> None:
        """The batch failed as a whole: fail its durable ops, keep its async ones in order."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as again:
                log.error("could not roll back in the job store %s: %s", self._path, again)
        retry: list[_Op[Any]] = []
        for op in batch:
            if op.done is not None:
                op.error = op.error or translate(exc, self._path)
                op.done.set()
            elif op.error is None:
                retry.append(op)
        with self._cond:
            if retry and self._closing:
                log.error("the job store %s is closing and %d changes could not be written: "
                          "%s", self._path, len(retry), exc)
                return
            if retry and not self._backoff:
                log.warning("writes to the job store %s fail (%s); retrying %d changes",
                            self._path, exc, len(retry))
            self._backoff = min(MAX_BACKOFF, max(0.01, 2 * self._backoff)) if retry else 0.0
            if retry:
                self._ops.extendleft(reversed(retry))
                self._rows += sum(op.rows for op in retry)
                self._first_at = time.monotonic()

    def _abandon(self, batch: list[_Op[Any]]) -> None:
        """The thread ends: fail the unsettled ops of ``batch`` and every op still queued
        (there are none after a clean close)."""
        with self._cond:
            self._closing = True
            queued, self._ops = list(self._ops), deque()
        for op in [*batch, *queued]:
            if op.done is not None and not op.done.is_set():
                op.error = StoreError(self._path, "the store's writer stopped")
                op.done.set()
        if any(op.done is None for op in queued):
            log.error("the writer of the job store %s stopped with changes not written",
                      self._path)
