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

In a batch, consecutive statements on distinct jobs commute: they run as one executemany
per statement. Functions run each in a savepoint, so that one breaking a rule fails alone;
a statement that breaks one makes the batch run again op by op (functions must bear being
run again in a new transaction).
"""

from __future__ import annotations

import _thread
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpsched._core.histogram import COMMIT_BOUNDS, Histogram, HistogramSnapshot
from mpsched._errors import MpschedError, StoreError, StoreFullError

log = logging.getLogger("mpsched.store")

MAX_BACKOFF = 1.0  # seconds between retries of a batch that failed as a whole
# Seconds an asynchronous op may wait for a durable caller's batch to carry it before the
# writer thread writes it: long enough that a busy manager's finishes gather into few
# commits (2 ms cost ~20% more CPU per job here), short next to anything that reads them
# (a flush writes at once).
ASYNC_DELAY = 0.010
ROWS_PER_STATEMENT = 256  # most rows of one multi-row statement (a few parameters each)


def translate(exc: BaseException, path: str) -> StoreError:
    """The typed error, naming ``path``, for an sqlite3 error."""
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" \
            or "database or disk is full" in str(exc):
        return StoreFullError(path)
    return StoreError(path, str(exc))


def execute_rows(conn: sqlite3.Connection, sql_for: Callable[[int], str],
                 rows: Sequence[Sequence[object]], per_statement: int) -> None:
    """Run ``rows``, in order, as multi-row statements: ``sql_for(n)`` is the statement for
    n rows, their parameters one after another.

    Each statement takes a power of two of rows, at most ``per_statement`` (a power of two):
    the largest that fits in what is left. Batches come in every size, and with one
    statement per batch each new size was a new statement to prepare (batches of 10 to 150
    rows: 9.9-11.9 against ~8.5 µs of CPU per row, ``benchmarks/bench_store_steps.py``); a
    connection now prepares a handful of statements in all, each once."""
    at, end = 0, len(rows)
    while at < end:
        size = min(per_statement, 1 << ((end - at).bit_length() - 1))
        chunk = rows[at:at + size]
        conn.execute(sql_for(size), [value for row in chunk for value in row])
        at += size


def _fails_batch(exc: BaseException, conn: sqlite3.Connection) -> bool:
    """True for errors of the store rather than of one op: full, I/O, busy, corrupt."""
    return not conn.in_transaction or isinstance(exc, sqlite3.OperationalError) \
        or type(exc) is sqlite3.DatabaseError


class _Op:
    """One queued change: a function of the connection, or a statement on one job."""

    __slots__ = ("apply", "error", "job_id", "lead", "params", "result", "rows", "settled",
                 "sql", "waiter")

    def __init__(self, apply: Callable[[sqlite3.Connection], Any] | None, sql: str,
                 params: Sequence[object], job_id: str | None, rows: int,
                 durable: bool) -> None:
        self.apply = apply
        self.sql = sql  # with job_id: run as conn.execute(sql, params)
        self.params = params
        self.job_id = job_id  # the one job the statement touches; None for a function
        self.rows = rows  # how much of a batch it fills
        # A durable caller blocks acquiring its waiter (a bare lock, held from the start);
        # it is released once the op is settled (committed or failed) or the lead is
        # handed to this caller. Asynchronous ops have none.
        self.waiter = _thread.allocate_lock() if durable else None
        if self.waiter is not None:
            self.waiter.acquire()
        self.settled = False  # set (with _mutex held) before the waiter is released
        self.lead = False  # the lead was handed to this op's caller (with _mutex held)
        self.result: Any = None
        self.error: MpschedError | None = None


class _Replay(Exception):
    """A batch is to be written again op by op (see ``Writer._write``)."""


def _nothing(conn: sqlite3.Connection) -> None:
    """A flush's op: it changes nothing, its commit covers every earlier op."""


class Writer:
    """The queue of one connection's ops, its lead, and the writer thread."""

    def __init__(self, conn: sqlite3.Connection, path: str, *, batch_size: int,
                 linger: float, idle: float,
                 housekeeping: Callable[[sqlite3.Connection], bool],
                 multi: Mapping[str, Callable[[int], str]] | None = None) -> None:
        self._conn = conn  # used only by the holder of the lead, once started
        self._path = path
        # A statement on one job -> the same for n jobs in one statement (see _apply_run).
        self._multi = multi or {}
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
        self._ops: deque[_Op] = deque()
        self._durable: deque[_Op] = deque()  # the durable ops of _ops, in the same order
        self._rows = 0  # queued rows: a batch is written at batch_size
        self._first_at = 0.0  # time.monotonic() when the oldest queued op came in
        self._busy = False  # a thread holds the lead: it alone uses the connection
        self._writer_idle = False  # the writer thread needs a notify to look again
        self._backoff = 0.0  # > 0 while a failed batch's async ops wait to be retried
        self._closing = False  # no more ops: close() was called, or the writer stopped
        self._closed = False  # close() was called
        self.commits = 0  # written by the holder of the lead only
        self._commit_seconds = Histogram(COMMIT_BOUNDS)  # each commit's time; on _mutex
        self._thread = threading.Thread(target=self._run, name="mpsched-store-writer",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers

    def commit_latency(self) -> HistogramSnapshot:
        """How long each transaction took to write and commit (fsync included), so far."""
        with self._mutex:
            return self._commit_seconds.snapshot()

    def call(self, apply: Callable[[sqlite3.Connection], Any], rows: int = 1) -> Any:
        """Queue ``apply`` and wait until it is committed; its result, or its error."""
        return self._call(_Op(apply, "", (), None, rows, durable=True))

    def post(self, apply: Callable[[sqlite3.Connection], object], rows: int = 1) -> None:
        """Queue ``apply`` to run after every op queued before it; return at once."""
        self._put(_Op(apply, "", (), None, rows, durable=False))

    def call_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """Run ``sql`` (it changes the row of ``job_id`` only) and wait for its commit."""
        self._call(_Op(None, sql, params, job_id, 1, durable=True))

    def post_update(self, sql: str, params: Sequence[object], job_id: str) -> None:
        """As ``call_update``, returning at once: written after every earlier op."""
        self._put(_Op(None, sql, params, job_id, 1, durable=False))

    def flush(self) -> None:
        """Wait until every op queued before this call is settled."""
        self._call(_Op(_nothing, "", (), None, 0, durable=True))

    def close(self) -> bool:
        """Write what is queued, stop the thread, close the connection. False if closed."""
        with self._mutex:
            if self._closed:
                return False
            self._closed = self._closing = True
            self._wake.notify()
        self._thread.join()
        self._conn.close()
        return True

    def _call(self, op: _Op) -> Any:
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

    def _await(self, op: _Op) -> None:
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

    def _put(self, op: _Op) -> bool:
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
            if (self._writer_idle and not self._busy) \
                    or before < self._batch_size <= self._rows:
                self._wake.notify()
            return False

    def _callers_lead_locked(self) -> bool:
        """Whether durable callers may write batches (else the writer thread alone does)."""
        return not self._linger and not self._backoff and not self._closing

    # ------------------------------------------------------------------ the lead

    def _lead(self, own: _Op | None) -> bool:
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

    def _take_locked(self) -> list[_Op]:
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

    def _write(self, batch: list[_Op]) -> None:
        """Apply ``batch`` in one transaction; on failure, ops are settled by ``_undo``."""
        conn = self._conn
        self._housekeeping_left = self._housekeeping(conn)
        began = time.monotonic()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._apply_all(batch, careful=False)
            except _Replay:  # a statement broke a rule: again, so that it fails alone
                conn.execute("ROLLBACK")
                for op in batch:
                    op.result = op.error = None
                conn.execute("BEGIN IMMEDIATE")
                self._apply_all(batch, careful=True)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._undo(batch, exc)
            return
        self.commits += 1
        for op in batch:
            if op.waiter is None and op.error is not None:
                log.error("a change to the job store %s was refused: %s", self._path, op.error)
        with self._mutex:
            self._commit_seconds.observe(time.monotonic() - began)
            if self._backoff:
                log.warning("the job store %s takes writes again", self._path)
                self._backoff = 0.0

    def _apply_all(self, batch: list[_Op], *, careful: bool) -> None:
        """Apply the ops in order. Consecutive statements on distinct jobs commute: they run
        as one executemany per statement, or (``careful``) one by one."""
        run: list[_Op] = []
        jobs: set[str] = set()
        for op in batch:
            if op.job_id is None or op.job_id in jobs:
                self._apply_run(run, careful)
                run, jobs = [], set()
            if op.job_id is None:
                self._apply(op)
            else:
                run.append(op)
                jobs.add(op.job_id)
        self._apply_run(run, careful)

    def _apply_run(self, run: list[_Op], careful: bool) -> None:
        """Raises _Replay when an executemany breaks a rule: which row did is unknown, and
        the rows before it are applied."""
        if careful or len(run) <= 1:
            for op in run:
                self._apply(op)
            return
        groups: dict[str, list[Sequence[object]]] = {}
        for op in run:
            groups.setdefault(op.sql, []).append(op.params)
        try:
            for sql, params in groups.items():
                many = self._multi.get(sql)
                if many is None or len(params) == 1:
                    self._conn.executemany(sql, params)
                    continue
                execute_rows(self._conn, many, params, ROWS_PER_STATEMENT)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and _fails_batch(exc, self._conn):
                raise
            raise _Replay from exc

    def _apply(self, op: _Op) -> None:
        """Run one op; one that breaks a rule fails alone (a function in a savepoint, a
        statement by itself: SQLite undoes a failed statement)."""
        conn = self._conn
        if op.apply is None:
            try:
                conn.execute(op.sql, op.params)
            except Exception as exc:
                if isinstance(exc, sqlite3.Error) and _fails_batch(exc, conn):
                    raise
                op.error = translate(exc, self._path)
            return
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

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as again:
                log.error("could not roll back in the job store %s: %s", self._path, again)

    def _undo(self, batch: list[_Op], exc: sqlite3.Error) -> None:
        """The batch failed as a whole: fail its durable ops, keep its async ones in order."""
        self._rollback()
        retry: list[_Op] = []
        for op in batch:
            if op.waiter is not None:
                op.error = op.error or translate(exc, self._path)
            elif op.error is None:
                retry.append(op)
        with self._mutex:
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

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while (write := self._next_batch()) is not None:
                if write:
                    self._lead(None)
                else:
                    self._housekeeping_left = self._housekeeping(self._conn)
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

    def _stop(self, batch: list[_Op], exc: BaseException) -> None:
        """A bug stopped a batch: refuse new ops, fail every unsettled op, free the lead."""
        log.error("the writer of the job store %s stopped", self._path, exc_info=exc)
        self._rollback()
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
            log.error("the writer of the job store %s stopped with changes not written",
                      self._path)
