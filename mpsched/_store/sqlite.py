"""SQLiteStore: the job store in one SQLite file (WAL mode), written with group commit.

Writes. Every call becomes an op on one queue; what is queued is applied in one transaction
and committed once ("group commit", :mod:`mpsched._store.writer`) by a durable caller that finds no
commit under way: callers that queue while one is under way share the next. Durable calls
(submit, cancel, prune, flush) wait for the commit covering their op; finish and requeue
return once logged (below) and ride in the next commit (a writer thread writes them within
~10 ms if no durable call comes). With durability="sync" every commit is fsynced, theirs too.

Leases. A lease is journalled once it is written to the lease log beside the file
(:mod:`mpsched._store.lease_log`; with durability="sync", on disk within ~2 ms). Its row
is written later: with the job's finish (one row update for both), or at the next flush,
whichever comes first. Requeues and finishes are logged too (a finish with its outcome, up
to ``OUTCOME_IN_LOG`` bytes; a larger outcome is committed before ``finish`` returns).
Opening the store folds what the log holds into SQLite, so every reader of the file sees
the leases and ends of a manager that died; ``recover`` reads the log too.

Prunes of finished jobs: by the caller of ``prune``, or a step at a time by the writer
(:mod:`mpsched._store.pruning`).

Failures. An op that breaks a rule (a repeated job id) fails alone. An error that undoes the
transaction (disk full, an I/O error, a lock held by another program) fails the durable
callers of that batch with a typed error; its asynchronous ops go back, in order, to the
head of the queue and are retried after a backoff, so no later op overtakes them. What was
committed before stays, and the store keeps taking writes.

Reads (get, jobs, find_key, recover) run on read-only connections of their own: WAL lets
them read the last commit while the writer writes, so a listing never waits for a batch
(:mod:`mpsched._store.readers`).

Opening the file (checks, lock file, schema) is :mod:`mpsched._store.file`'s part; the SQL
of the jobs table is :mod:`mpsched._store.statements`'.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from mpsched._core.histogram import HistogramSnapshot
from mpsched._core.job import After, JobRecord, JobState
from mpsched._core.options import Durability, DurabilityLike
from mpsched._errors import ConfigError, InvalidJobError, StoreError
from mpsched._store.base import (
    DAY,
    JournalStore,
    Recovery,
    RunningJob,
    StoredJob,
    StoredSchedule,
    check_finish_state,
    check_options,
)
from mpsched._store.commit import execute_rows
from mpsched._store.file import connect_writer, open_checked
from mpsched._store.lease_log import LeaseLog
from mpsched._store.lease_records import LogRecord, ended, leased, requeued, split
from mpsched._store.pruning import Pruner
from mpsched._store.readers import Readers, no_gc
from mpsched._store.statements import (
    FAILED_OUTCOME,
    FINISH,
    FINISH_LEASED,
    FOLD,
    FOLD_END,
    LEASE,
    MULTI,
    PROGRESS,
    PRUNE,
    RECORD,
    REQUEUE,
    REQUEUE_ENDED,
    RETRIED,
    RETRY_STATE,
    ROWS_PER_INSERT,
    STORED,
    fresh_retry,
    insert_rows,
    job_record,
    stored_job,
)
from mpsched._store.writer import Writer

log = logging.getLogger("mpsched.store")


def _overlay(
    records: list[LogRecord], pending: list[StoredJob], running: list[RunningJob]
) -> tuple[list[StoredJob], list[RunningJob]]:
    """Pending and running jobs as the lease log's records leave them (the last of each job
    wins; a job the log has ended, or SQLite has neither pending nor running, is finished,
    and stays so)."""
    moves, ends = split(records)
    jobs: dict[str, tuple[StoredJob, str | None]] = {job.job_id: (job, None) for job in pending}
    jobs.update((r.job.job_id, (r.job, r.worker_id)) for r in running)
    for job_id in ends:
        jobs.pop(job_id, None)
    for job_id, record in moves.items():
        if job_id in jobs:
            job, _worker = jobs[job_id]
            jobs[job_id] = (
                job._replace(attempt=record.attempt),
                record.worker_id if record.running else None,
            )
    ordered = sorted(jobs.values(), key=lambda pair: pair[0].seq)
    return (
        [job for job, worker in ordered if worker is None],
        [RunningJob(job=job, worker_id=worker) for job, worker in ordered if worker is not None],
    )


def check_batching(batch_size: int, linger: float, idle: float) -> None:
    """Raise ConfigError unless the writer's options are in range."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError("batch_size", batch_size, "a positive int")
    if not 0 <= linger <= 10:
        raise ConfigError("linger", linger, "a number of seconds in [0, 10]")
    if not 0 < idle < float("inf"):
        raise ConfigError("prune_interval", idle, "a positive number")


class SQLiteStore(JournalStore):
    """Jobs in the SQLite file ``path``: they survive the manager, one manager at a time.

    Args:
        durability: ``"sync"`` (synchronous=FULL: a commit survives a power cut) or
            ``"process"`` (NORMAL: survives the process, not the machine).
        result_ttl: seconds a finished job's record and outcome are kept.
        clock: the wall clock, UTC epoch seconds (injected for tests).
        batch_size: the most rows one commit writes.
        linger: seconds the writer waits after a batch's first op for ``batch_size`` rows;
            0 (the default) writes at once whatever queued during the last commit, which
            measured faster here at every number of concurrent callers.
        prune_interval: seconds between automatic prunes by the writer.
    Raises:
        StoreError: a missing or read-only directory, a file that is not an mpsched store,
            a newer schema, a corrupt file; StoreLockedError when another manager has it.
        ConfigError: an option out of range, or an unknown durability.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: DurabilityLike = "sync",
        result_ttl: float = DAY,
        clock: Callable[[], float] = time.time,
        batch_size: int = 512,
        linger: float = 0.0,
        prune_interval: float = 60.0,
    ) -> None:
        durability = Durability.coerce(durability)
        check_options(result_ttl)
        check_batching(batch_size, linger, prune_interval)
        self._path = os.path.realpath(os.fspath(path))  # one lock file, whatever the route
        self._durability = durability
        self._result_ttl = float(result_ttl)
        self._clock = clock
        pruner = Pruner(self._path, self._result_ttl, prune_interval, clock)
        self._readers = Readers(self._path)
        self._lock_fd = open_checked(self._path)
        try:
            conn = connect_writer(self._path, durability)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._writer = Writer(
            conn,
            self._path,
            batch_size=batch_size,
            linger=linger,
            idle=prune_interval,
            housekeeping=pruner.step,
            multi=MULTI,
        )
        # Guards _leased and orders the writer's ops on a job with them: leases whose row
        # is not queued yet (job id -> worker, attempt). Their row is queued with the job's
        # finish, or at a flush. Taken after the lease log's lock, never before it.
        self._leased_lock = threading.Lock()
        self._leased: dict[str, tuple[str, int]] = {}
        leases: LeaseLog | None = None
        try:
            leases = self._leases = LeaseLog(
                self._path + "-leases", sync=durability is Durability.SYNC, flush=self.flush
            )
            self._fold_leases()
        except BaseException:
            if leases is not None:
                leases.release(remove=False)  # its syncer thread too
            self._writer.close()
            os.close(self._lock_fd)
            raise

    def _fold_leases(self) -> None:
        """Apply the lease log's last lease or requeue of each job to SQLite, and then the
        ends it has, then empty the log. An end whose outcome the log does not carry (too
        large, and not yet committed when the manager died) leaves the job ended, without
        an outcome (its watchers are told it was lost)."""
        moves, ends = split(self._leases.read())
        rows = [
            ("running" if r.running else "pending", r.worker_id, r.attempt, job_id)
            for job_id, r in moves.items()
        ]
        end_rows = [
            (str(r.ended), r.outcome, r.finished_wall, job_id) for job_id, r in ends.items()
        ]
        if rows or end_rows:

            def fold(conn: sqlite3.Connection) -> None:
                conn.executemany(FOLD, rows)
                conn.executemany(FOLD_END, end_rows)

            self._writer.call(fold, len(rows) + len(end_rows))
        self._leases.reset()

    @property
    def location(self) -> str:
        return self._path

    @property
    def durability(self) -> str:
        """``"sync"`` or ``"process"``."""
        return self._durability

    @property
    def commits(self) -> int:
        """Transactions the writer committed so far (group commit makes it < ops)."""
        return self._writer.commits

    def commit_latency(self) -> HistogramSnapshot | None:
        return self._writer.commit_latency()

    def size(self) -> int | None:
        return sum(
            os.path.getsize(p)
            for p in (self._path, self._path + "-wal", self._leases.path)
            if os.path.exists(p)
        )

    def recover(self) -> Recovery:
        with self._readers.connection() as conn, no_gc():
            conn.execute("BEGIN")  # one snapshot for the three reads
            try:
                pending = list(
                    map(
                        stored_job,
                        conn.execute(
                            f"SELECT {STORED} FROM jobs WHERE state = 'pending' ORDER BY seq"
                        ),
                    )
                )
                rows = conn.execute(
                    f"SELECT {STORED}, worker_id FROM jobs WHERE state = 'running' ORDER BY seq"
                )
                running = [
                    RunningJob(job=stored_job(stored), worker_id=worker_id)
                    for *stored, worker_id in rows
                ]
                [last] = conn.execute("SELECT max(seq) FROM jobs").fetchone()
                retry = dict(
                    conn.execute(
                        "SELECT job_id, retry FROM jobs WHERE retry IS NOT NULL "
                        "AND state IN ('pending', 'running')"
                    )
                )
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")
        records = self._leases.read()
        if records:  # leases and requeues SQLite may not have yet
            pending, running = _overlay(records, pending, running)
        return Recovery(
            pending=pending,
            running=running,
            next_seq=0 if last is None else last + 1,
            retry=retry or None,
        )

    def submit(
        self, jobs: Sequence[StoredJob], retry: Mapping[str, str] | None = None
    ) -> list[str]:
        jobs = list(jobs)
        if not jobs:
            return []
        ids: list[str] = self._writer.call(lambda conn: self._insert(conn, jobs, retry), len(jobs))
        return ids

    def submit_waiting(
        self,
        jobs: Sequence[StoredJob],
        parents: Sequence[After],
        retry: Mapping[str, str] | None = None,
    ) -> None:
        rows = [
            (job.job_id, parent, parent in after.results, after.allow_failure)
            for job, after in zip(jobs, parents, strict=True)
            for parent in after.parents
        ]
        jobs = list(jobs)

        def insert(conn: sqlite3.Connection) -> None:
            self._insert(conn, jobs, retry)
            conn.executemany("INSERT OR REPLACE INTO job_parents VALUES (?, ?, ?, ?)", rows)

        self._writer.call(insert, len(jobs) + len(rows))

    def waiting(self) -> dict[str, After]:
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

    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        self._leases.append(
            leased(job_id, worker_id, attempt),
            lambda: self._defer_lease(job_id, worker_id, attempt),
        )

    def _defer_lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        with self._leased_lock:
            self._leased[job_id] = (worker_id, attempt)

    def finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        check_finish_state(state)
        record = ended(job_id, state, finished_wall, outcome)
        self._leases.append(
            record, lambda: self._queue_finish(job_id, state, outcome, finished_wall)
        )
        if outcome is not None and record.outcome is None:  # too long for the log
            try:
                self._writer.flush()
            except StoreError as exc:  # the finish stays queued, retried in order
                log.warning(
                    "the outcome of job %s (%d bytes) is not committed yet (%s); it is retried",
                    job_id,
                    len(outcome),
                    exc,
                )

    def _queue_finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        ended = (state.value, outcome, finished_wall)
        with self._leased_lock:
            leased = self._leased.pop(job_id, None)
            if leased is None:
                self._writer.post_update(FINISH.one, (*ended, job_id), job_id)
            else:  # one row update for the lease and its end
                self._writer.post_update(FINISH_LEASED.one, (*ended, *leased, job_id), job_id)

    def requeue(self, job_id: str, attempt: int) -> None:
        self._leases.append(requeued(job_id, attempt), lambda: self._queue_requeue(job_id, attempt))

    def requeue_ended(
        self, job_id: str, client_id: str, due_wall: float
    ) -> tuple[StoredJob, str | None] | None:
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
        if requeued_job is not None:
            # After its end in the lease log, if the log has it: the end no longer holds
            # (lease_records.split), and a restart finds the job pending.
            self._leases.append(requeued(job_id, 0), lambda: None)
        return requeued_job

    def set_progress(self, job_id: str, progress: str) -> None:
        self._writer.post_update(PROGRESS.one, (progress, job_id), job_id)

    def _queue_requeue(self, job_id: str, attempt: int) -> None:
        with self._leased_lock:
            self._leased.pop(job_id, None)
            self._writer.post_update(REQUEUE.one, (attempt, job_id), job_id)

    def retried(self, job_id: str, attempt: int, due_wall: float, retry: str) -> None:
        self._leases.append(
            requeued(job_id, attempt), lambda: self._queue_retried(job_id, attempt, due_wall, retry)
        )
        self._writer.flush()  # the back-off's due time survives a crash from here on

    def _queue_retried(self, job_id: str, attempt: int, due_wall: float, retry: str) -> None:
        with self._leased_lock:
            self._leased.pop(job_id, None)
            self._writer.post_update(RETRIED.one, (attempt, due_wall, retry, job_id), job_id)

    def retry_ended(self, job_id: str, retry: str) -> None:
        self._writer.post_update(RETRY_STATE, (retry, job_id), job_id)

    def flush(self) -> None:
        with self._leased_lock:  # the rows of leases so far, then wait for all of it
            leased, self._leased = self._leased, {}
            for job_id, (worker_id, attempt) in leased.items():
                self._writer.post_update(LEASE.one, (worker_id, attempt, job_id), job_id)
        self._writer.flush()

    def get(self, job_id: str) -> JobRecord | None:
        with self._readers.connection() as conn:
            row = conn.execute(
                f"SELECT {RECORD}, outcome FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
        return None if row is None else job_record(row)

    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        where = "" if state is None else "WHERE state = ?"
        params: tuple[object, ...] = () if state is None else (JobState(state).value,)
        with self._readers.connection() as conn:
            rows = conn.execute(
                f"SELECT {RECORD}, {FAILED_OUTCOME} FROM jobs {where} ORDER BY seq LIMIT ?",
                (*params, -1 if limit is None else limit),
            ).fetchall()
        return [job_record(row) for row in rows]

    def find_key(self, key: str) -> JobRecord | None:
        with self._readers.connection() as conn:
            row = conn.execute(
                f"SELECT {RECORD}, outcome FROM jobs WHERE key = ? AND state <> 'cancelled' "
                "AND (finished_wall IS NULL OR finished_wall > ?)",
                (key, self._clock() - self._result_ttl),
            ).fetchone()
        return None if row is None else job_record(row)

    def prune(self, now_wall: float) -> int:
        count: int = self._writer.call(
            lambda conn: conn.execute(PRUNE, (now_wall - self._result_ttl,)).rowcount
        )
        return count

    def close(self) -> None:
        self._readers.close()  # first: the writer's connection, closing last, checkpoints
        self._leases.close()
        try:
            self.flush()
            written = True  # every logged change is in SQLite: the log can go
        except StoreError:
            written = False
        if self._writer.close():
            self._leases.release(remove=written)
            os.close(self._lock_fd)

    def save_schedule(self, schedule: StoredSchedule) -> None:
        self._writer.call(
            lambda conn: conn.execute(
                "INSERT INTO schedules (schedule_id, spec, state) VALUES (?, ?, ?) "
                "ON CONFLICT (schedule_id) DO UPDATE SET spec = excluded.spec, "
                "state = excluded.state",
                schedule,
            )
        )

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        self._writer.post(
            lambda conn: conn.execute(
                "UPDATE schedules SET state = ? WHERE schedule_id = ?", (state, schedule_id)
            )
        )

    def delete_schedule(self, schedule_id: str) -> None:
        self._writer.call(
            lambda conn: conn.execute("DELETE FROM schedules WHERE schedule_id = ?", (schedule_id,))
        )

    def save_limit(self, name: str, form: str | None) -> None:
        if form is None:
            self._writer.call(
                lambda conn: conn.execute("DELETE FROM limits WHERE name = ?", (name,))
            )
        else:
            self._writer.call(
                lambda conn: conn.execute(
                    "INSERT INTO limits (name, form) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET form = excluded.form",
                    (name, form),
                )
            )

    def saved_limits(self) -> dict[str, str]:
        with self._readers.connection() as conn:
            rows = conn.execute("SELECT name, form FROM limits ORDER BY name").fetchall()
        return dict(rows)

    def schedules(self) -> list[StoredSchedule]:
        self.flush()  # states posted so far are readable
        with self._readers.connection() as conn:
            rows = conn.execute(
                "SELECT schedule_id, spec, state FROM schedules ORDER BY rowid"
            ).fetchall()
        return [StoredSchedule._make(row) for row in rows]

    def _insert(
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
