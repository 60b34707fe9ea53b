"""The SQL of the SQLite store's ``jobs`` table: its column lists, the statements on one job
(each also for n jobs in one statement), multi-row inserts, the lease log's fold, prunes,
and rows read back as records."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from mpsched._core.job import DEFAULT_QUEUE, JobRecord, JobState
from mpsched._core.retrying import RetryState
from mpsched._store.base import StoredJob

# The columns of a StoredJob, and of a JobRecord but its outcome (selected after them when
# it is wanted).
STORED = (
    "job_id, client_id, key, name, payload, priority, due_wall, seq, timeout, retries, "
    "attempt, submitted_wall, queue, limit_name"
)
RECORD = (
    "job_id, client_id, key, name, priority, due_wall, seq, timeout, retries, attempt, "
    "submitted_wall, state, worker_id, finished_wall, retry, progress, queue, "
    "limit_name"
)
# A listing's outcome column: a failed job's only (its error shows in the listing).
FAILED_OUTCOME = "CASE WHEN state = 'failed' THEN outcome END"
PRUNE = "DELETE FROM jobs WHERE finished_wall <= ?"


class ByJob(NamedTuple):
    """An UPDATE of one job's row, its id the last parameter, and the same for n rows in one
    statement: SQLite then runs a batch's rows in one step, where executemany() takes one
    step per row, and the sqlite3 module lets go of the GIL around each step (under load,
    every step then waits to get it back)."""

    one: str
    many: Callable[[int], str]


def by_job(**columns: str | None) -> ByJob:
    """``columns``: column -> an SQL constant, or None for a parameter (in that order)."""
    params = [name for name, value in columns.items() if value is None]
    one = ", ".join(
        f"{name} = {'?' if value is None else value}" for name, value in columns.items()
    )
    many = ", ".join(
        f"{name} = {f'v.column{params.index(name) + 1}' if value is None else value}"
        for name, value in columns.items()
    )
    row = f"({', '.join('?' * (len(params) + 1))})"

    @functools.lru_cache(maxsize=64)
    def for_rows(rows: int) -> str:
        return (
            f"UPDATE jobs SET {many} FROM (VALUES {', '.join([row] * rows)}) AS v "
            f"WHERE jobs.job_id = v.column{len(params) + 1}"
        )

    return ByJob(f"UPDATE jobs SET {one} WHERE job_id = ?", for_rows)


# Statements on one job, its id last: the writer runs a batch's consecutive ones together.
LEASE = by_job(state="'running'", worker_id=None, attempt=None)
FINISH = by_job(state=None, outcome=None, finished_wall=None)
FINISH_LEASED = by_job(state=None, outcome=None, finished_wall=None, worker_id=None, attempt=None)
REQUEUE = by_job(state="'pending'", worker_id="NULL", attempt=None)
PROGRESS = by_job(progress=None)
# UPDATE ... FROM came with SQLite 3.33; older ones run a batch's rows by executemany().
MULTI = (
    {s.one: s.many for s in (LEASE, FINISH, FINISH_LEASED, REQUEUE)}
    if sqlite3.sqlite_version_info >= (3, 33)
    else {}
)
# Rows of one INSERT, 14 parameters each: under SQLite's default limit of parameters per
# statement, 32766 since SQLite 3.32 and 999 before.
ROWS_PER_INSERT = 512 if sqlite3.sqlite_version_info >= (3, 32) else 64


@functools.lru_cache(maxsize=64)
def insert_rows(rows: int) -> str:
    values = f"({', '.join('?' * 14)}, 'pending')"
    return f"INSERT INTO jobs ({STORED}, state) VALUES {', '.join([values] * rows)}"


# A failed or cancelled job pending again (Client.requeue): its end forgotten, no attempt.
REQUEUE_ENDED = (
    "UPDATE jobs SET state = 'pending', attempt = 0, worker_id = NULL, "
    "finished_wall = NULL, outcome = NULL, progress = NULL, client_id = ?, "
    "due_wall = ? WHERE job_id = ? AND state IN ('failed', 'cancelled')"
)


def fresh_retry(retry: str | None) -> str | None:
    """A requeued job's retry state: its policy, without the errors and notes of its
    earlier attempts (None for a job without a policy)."""
    if retry is None:
        return None
    try:
        terms = RetryState.decode(retry).terms
    except ValueError:
        return None
    return None if terms is None else RetryState(terms).encode()


# A job's last record in the lease log is its state unless it is finished or cancelled.
FOLD = (
    "UPDATE jobs SET state = ?, worker_id = ?, attempt = ? "
    "WHERE job_id = ? AND state IN ('pending', 'running')"
)
# An end the log has and SQLite may not (after the lease or requeue before it, if any).
FOLD_END = (
    "UPDATE jobs SET state = ?, outcome = ?, finished_wall = ? "
    "WHERE job_id = ? AND state IN ('pending', 'running')"
)


# A row as a StoredJob, without the Python-level call of StoredJob._make: a million of these
# are made at recovery.
stored_job: Callable[[Sequence[Any]], StoredJob] = functools.partial(tuple.__new__, StoredJob)


def job_record(row: Sequence[Any]) -> JobRecord:
    """A row of the RECORD columns (and the outcome, if selected after them)."""
    stored, rest = row[:11], row[11:]
    state, worker_id, finished_wall, retry, progress, queue, limit, *outcome = rest
    return JobRecord._make(
        (
            *stored,
            JobState(state),
            worker_id,
            finished_wall,
            outcome[0] if outcome else None,
            None if retry is None else RetryState.decode(retry).error,
            progress,
            queue or DEFAULT_QUEUE,
            limit,
            None,
        )
    )


# A job put back to pending after a failed attempt, due again at its back-off.
RETRIED = by_job(state="'pending'", worker_id="NULL", attempt=None, due_wall=None, retry=None)
RETRY_STATE = "UPDATE jobs SET retry = ? WHERE job_id = ?"
