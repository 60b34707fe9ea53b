"""One batch of a store writer's ops, written in one transaction and committed.

In a batch, consecutive statements on distinct jobs commute: they run as one executemany
(or one multi-row statement) per statement. Functions run each in a savepoint, so that one
breaking a rule fails alone; a statement that breaks one makes the batch run again op by op
(functions must bear being run again in a new transaction). An error of the store rather
than of an op (full, I/O, busy, corrupt) undoes the whole batch: the writer
(:mod:`mpsched._store.writer`) then fails its durable ops and retries the others.
"""

from __future__ import annotations

import _thread
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpsched._errors import MpschedError, StoreError, StoreFullError

log = logging.getLogger("mpsched.store")

ROWS_PER_STATEMENT = 256  # most rows of one multi-row statement (a few parameters each)


def translate(exc: BaseException, path: str) -> StoreError:
    """The typed error, naming ``path``, for an sqlite3 error."""
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" or "database or disk is full" in str(
        exc
    ):
        return StoreFullError(path)
    return StoreError(path, str(exc))


def execute_rows(
    conn: sqlite3.Connection,
    sql_for: Callable[[int], str],
    rows: Sequence[Sequence[object]],
    per_statement: int,
) -> None:
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
        chunk = rows[at : at + size]
        conn.execute(sql_for(size), [value for row in chunk for value in row])
        at += size


def fails_batch(exc: BaseException, conn: sqlite3.Connection) -> bool:
    """True for errors of the store rather than of one op: full, I/O, busy, corrupt."""
    return (
        not conn.in_transaction
        or isinstance(exc, sqlite3.OperationalError)
        or type(exc) is sqlite3.DatabaseError
    )


class Op:
    """One queued change: a function of the connection, or a statement on one job."""

    __slots__ = (
        "apply",
        "error",
        "job_id",
        "lead",
        "params",
        "result",
        "rows",
        "settled",
        "sql",
        "waiter",
    )

    def __init__(
        self,
        apply: Callable[[sqlite3.Connection], Any] | None,
        sql: str,
        params: Sequence[object],
        job_id: str | None,
        rows: int,
        durable: bool,
    ) -> None:
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
        self.settled = False  # set (with the writer's mutex held) before the waiter is released
        self.lead = False  # the lead was handed to this op's caller (with that mutex held)
        self.result: Any = None
        self.error: MpschedError | None = None


class Replay(Exception):
    """A batch is to be written again op by op (see ``Committer.commit``)."""


class Committer:
    """Writes batches of ops to one connection, a transaction each; used by one thread at a
    time (the holder of the writer's lead), so it needs no lock."""

    def __init__(
        self, conn: sqlite3.Connection, path: str, multi: Mapping[str, Callable[[int], str]]
    ) -> None:
        self.conn = conn
        self._path = path
        # A statement on one job -> the same for n jobs in one statement (see _apply_run).
        self._multi = multi
        self.commits = 0  # transactions committed so far

    def commit(self, batch: list[Op]) -> sqlite3.Error | None:
        """Apply ``batch`` in one transaction and commit it: each op has its result or its
        error then. Returns the error that undid the whole batch (rolled back), if any."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._apply_all(batch, careful=False)
            except Replay:  # a statement broke a rule: again, so that it fails alone
                conn.execute("ROLLBACK")
                for op in batch:
                    op.result = op.error = None
                conn.execute("BEGIN IMMEDIATE")
                self._apply_all(batch, careful=True)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self.rollback()
            return exc
        self.commits += 1
        return None

    def close(self) -> None:
        self.conn.close()

    def _apply_all(self, batch: list[Op], *, careful: bool) -> None:
        """Apply the ops in order. Consecutive statements on distinct jobs commute: they run
        as one executemany per statement, or (``careful``) one by one."""
        run: list[Op] = []
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

    def _apply_run(self, run: list[Op], careful: bool) -> None:
        """Raises Replay when an executemany breaks a rule: which row did is unknown, and
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
                    self.conn.executemany(sql, params)
                    continue
                execute_rows(self.conn, many, params, ROWS_PER_STATEMENT)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and fails_batch(exc, self.conn):
                raise
            raise Replay from exc

    def _apply(self, op: Op) -> None:
        """Run one op; one that breaks a rule fails alone (a function in a savepoint, a
        statement by itself: SQLite undoes a failed statement)."""
        conn = self.conn
        if op.apply is None:
            try:
                conn.execute(op.sql, op.params)
            except Exception as exc:
                if isinstance(exc, sqlite3.Error) and fails_batch(exc, conn):
                    raise
                op.error = translate(exc, self._path)
            return
        conn.execute("SAVEPOINT op")
        try:
            op.result = op.apply(conn)
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) and fails_batch(exc, conn):
                raise
            conn.execute("ROLLBACK TO op")
            if isinstance(exc, MpschedError):
                op.error = exc
            else:
                log.exception("a change to the job store %s failed", self._path)
                op.error = translate(exc, self._path)
        conn.execute("RELEASE op")

    def rollback(self) -> None:
        """Undo the transaction under way, if any."""
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error as again:
                log.error("could not roll back in the job store %s: %s", self._path, again)
