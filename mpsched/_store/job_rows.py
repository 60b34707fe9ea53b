"""The jobs table of a SQLite store, besides leases and ends: submits with their keys, jobs
waiting for their parents, cancels, requeues of ended jobs, and prunes. Each change is one
op of the writer, run in its transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence

from mpsched._core.job import After
from mpsched._errors import InvalidJobError
from mpsched._store.base import StoredJob
from mpsched._store.commit import execute_rows
from mpsched._store.readers import Readers
from mpsched._store.statements import (
    PRUNE,
    REQUEUE_ENDED,
    RETRY_STATE,
    ROWS_PER_INSERT,
    STORED,
    fresh_retry,
    insert_rows,
    stored_job,
)
from mpsched._store.writer import Writer


class JobRows:
    """Inserts, cancels, requeues and prunes of job rows, through the store's writer.

    Args:
        clock: the wall clock, UTC epoch seconds.
        result_ttl: seconds a finished job's record (and the key it holds) is kept.
    """

    def __init__(
        self, writer: Writer, readers: Readers, clock: Callable[[], float], result_ttl: float
    ) -> None:
        self._writer = writer
        self._readers = readers
        self._clock = clock
        self._result_ttl = result_ttl

    def insert(
        self,
        conn: sqlite3.Connection,
        jobs: list[StoredJob],
        retry: Mapping[str, str] | None = None,
    ) -> list[str]:
        """In the writer: resolve keys against the store, then insert the new jobs."""
        now = self._clock()
        held: dict[str, str] = {}
        ids: list[str] = []
        new: list[StoredJob] = []
        for job in jobs:
            holder = (
                None if job.key is None else (held.get(job.key) or self._holder(conn, job.key, now))
            )
            if holder is None:
                new.append(job)
                if job.key is not None:
                    held[job.key] = job.job_id
            ids.append(job.job_id if holder is None else holder)
        try:
            execute_rows(conn, insert_rows, new, ROWS_PER_INSERT)
        except sqlite3.IntegrityError as exc:
            raise InvalidJobError(
                f"a job id or seq repeats one in the batch or the store ({exc})"
            ) from None
        if retry:  # in the same transaction: a job is never stored without its policy
            conn.executemany(
                RETRY_STATE, [(retry[job.job_id], job.job_id) for job in new if job.job_id in retry]
            )
        return ids

    def _holder(self, conn: sqlite3.Connection, key: str, now: float) -> str | None:
        """The id of the job holding ``key``; an expired holder is deleted here."""
        row = conn.execute(
            "SELECT job_id, finished_wall FROM jobs WHERE key = ? AND state <> 'cancelled'", (key,)
        ).fetchone()
        if row is None:
            return None
        job_id, finished_wall = row
        if finished_wall is not None and finished_wall <= now - self._result_ttl:
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            return None
        return str(job_id)

    def submit_waiting(
        self,
        jobs: Sequence[StoredJob],
        parents: Sequence[After],
        retry: Mapping[str, str] | None = None,
    ) -> None:
        """Insert jobs with their parents (``parents``, one each), in one commit."""
        rows = [
            (job.job_id, parent, parent in after.results, after.allow_failure)
            for job, after in zip(jobs, parents, strict=True)
            for parent in after.parents
        ]
        jobs = list(jobs)

        def insert(conn: sqlite3.Connection) -> None:
            self.insert(conn, jobs, retry)
            conn.executemany("INSERT OR REPLACE INTO job_parents VALUES (?, ?, ?, ?)", rows)

        self._writer.call(insert, len(jobs) + len(rows))

    def waiting(self) -> dict[str, After]:
        """The parents of each pending job that waits for them (others' are dropped)."""
        self._writer.call(
            lambda conn: conn.execute(
                "DELETE FROM job_parents WHERE job_id NOT IN "
                "(SELECT job_id FROM jobs WHERE state = 'pending')"
            )
        )
        parents: dict[str, list[str]] = {}
        results: dict[str, list[str]] = {}
        allow: dict[str, bool] = {}
        with self._readers.connection() as conn:
            for job_id, parent, takes, allow_failure in conn.execute(
                "SELECT job_id, parent_id, takes_result, allow_failure FROM job_parents "
                "ORDER BY rowid"
            ):
                parents.setdefault(job_id, []).append(parent)
                if takes:
                    results.setdefault(job_id, []).append(parent)
                allow[job_id] = bool(allow_failure)
        return {
            job_id: After(tuple(ids), tuple(results.get(job_id, ())), allow[job_id])
            for job_id, ids in parents.items()
        }

    def cancel(self, job_ids: Sequence[str], finished_wall: float) -> None:
        """Cancel those of ``job_ids`` still pending, and wait for the commit."""
        rows = [(finished_wall, job_id) for job_id in job_ids]
        if rows:
            self._writer.call(
                lambda conn: conn.executemany(
                    "UPDATE jobs SET state = 'cancelled', finished_wall = ? "
                    "WHERE job_id = ? AND state = 'pending'",
                    rows,
                ),
                len(rows),
            )

    def requeue_ended(
        self, job_id: str, client_id: str, due_wall: float
    ) -> tuple[StoredJob, str | None] | None:
        """Put an ended job back pending, due at ``due_wall``, its retry state fresh: the
        job and that state, or None when it is not ended (or unknown)."""

        def requeue(conn: sqlite3.Connection) -> tuple[StoredJob, str | None] | None:
            try:
                changed = conn.execute(REQUEUE_ENDED, (client_id, due_wall, job_id)).rowcount
            except sqlite3.IntegrityError:
                raise InvalidJobError(
                    f"job {job_id} cannot be requeued: its key is held by another job"
                ) from None
            if not changed:
                return None
            *row, retry = conn.execute(
                f"SELECT {STORED}, retry FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
            fresh = fresh_retry(retry)
            if fresh != retry:
                conn.execute(RETRY_STATE, (fresh, job_id))
            return stored_job(row), fresh

        requeued_job: tuple[StoredJob, str | None] | None = self._writer.call(requeue)
        return requeued_job

    def prune(self, now_wall: float) -> int:
        """Delete the jobs ended ``result_ttl`` or more before ``now_wall``; how many."""
        count: int = self._writer.call(
            lambda conn: conn.execute(PRUNE, (now_wall - self._result_ttl,)).rowcount
        )
        return count
