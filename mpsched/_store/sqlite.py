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
of the jobs table is :mod:`mpsched._store.statements`'. The store's collaborators:
:mod:`~mpsched._store.deferred_leases` (lease rows not queued yet),
:mod:`~mpsched._store.job_rows` (submits, cancels, requeues, prunes),
:mod:`~mpsched._store.recovery` (the lease log folded in, recovery) and
:mod:`~mpsched._store.schedule_rows` (schedules and limits).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

from mpsched._core.histogram import HistogramSnapshot
from mpsched._core.job import After, JobRecord, JobState
from mpsched._core.options import Durability, DurabilityLike
from mpsched._errors import ConfigError, StoreError
from mpsched._store import recovery
from mpsched._store.base import (
    DAY,
    JournalStore,
    Recovery,
    StoredJob,
    StoredSchedule,
    check_finish_state,
    check_options,
)
from mpsched._store.deferred_leases import DeferredLeases
from mpsched._store.file import connect_writer, open_checked
from mpsched._store.job_rows import JobRows
from mpsched._store.lease_log import LeaseLog
from mpsched._store.lease_records import ended, leased, requeued
from mpsched._store.pruning import Pruner
from mpsched._store.readers import Readers
from mpsched._store.schedule_rows import ScheduleRows
from mpsched._store.statements import (
    FAILED_OUTCOME,
    MULTI,
    PROGRESS,
    RECORD,
    RETRY_STATE,
    job_record,
)
from mpsched._store.writer import Writer

log = logging.getLogger("mpsched.store")


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
        self._deferred = DeferredLeases(self._writer)
        self._rows = JobRows(self._writer, self._readers, clock, self._result_ttl)
        self._schedules = ScheduleRows(self._writer, self._readers, self.flush)
        leases: LeaseLog | None = None
        try:
            leases = self._leases = LeaseLog(
                self._path + "-leases", sync=durability is Durability.SYNC, flush=self.flush
            )
            recovery.fold_leases(leases, self._writer)
        except BaseException:
            if leases is not None:
                leases.release(remove=False)  # its syncer thread too
            self._writer.close()
            os.close(self._lock_fd)
            raise

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
        return recovery.recover(self._readers, self._leases)

    def submit(
        self, jobs: Sequence[StoredJob], retry: Mapping[str, str] | None = None
    ) -> list[str]:
        jobs = list(jobs)
        if not jobs:
            return []
        rows = self._rows
        ids: list[str] = self._writer.call(lambda conn: rows.insert(conn, jobs, retry), len(jobs))
        return ids

    def submit_waiting(
        self,
        jobs: Sequence[StoredJob],
        parents: Sequence[After],
        retry: Mapping[str, str] | None = None,
    ) -> None:
        self._rows.submit_waiting(jobs, parents, retry)

    def waiting(self) -> dict[str, After]:
        return self._rows.waiting()

    def cancel(self, job_ids: Sequence[str], finished_wall: float) -> None:
        self._rows.cancel(job_ids, finished_wall)

    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        deferred = self._deferred
        self._leases.append(
            leased(job_id, worker_id, attempt),
            lambda: deferred.lease(job_id, worker_id, attempt),
        )

    def finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        check_finish_state(state)
        record = ended(job_id, state, finished_wall, outcome)
        deferred = self._deferred
        self._leases.append(record, lambda: deferred.finish(job_id, state, outcome, finished_wall))
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

    def requeue(self, job_id: str, attempt: int) -> None:
        deferred = self._deferred
        self._leases.append(requeued(job_id, attempt), lambda: deferred.requeue(job_id, attempt))

    def requeue_ended(
        self, job_id: str, client_id: str, due_wall: float
    ) -> tuple[StoredJob, str | None] | None:
        requeued_job = self._rows.requeue_ended(job_id, client_id, due_wall)
        if requeued_job is not None:
            # After its end in the lease log, if the log has it: the end no longer holds
            # (lease_records.split), and a restart finds the job pending.
            self._leases.append(requeued(job_id, 0), lambda: None)
        return requeued_job

    def set_progress(self, job_id: str, progress: str) -> None:
        self._writer.post_update(PROGRESS.one, (progress, job_id), job_id)

    def retried(self, job_id: str, attempt: int, due_wall: float, retry: str) -> None:
        deferred = self._deferred
        self._leases.append(
            requeued(job_id, attempt), lambda: deferred.retried(job_id, attempt, due_wall, retry)
        )
        self._writer.flush()  # the back-off's due time survives a crash from here on

    def retry_ended(self, job_id: str, retry: str) -> None:
        self._writer.post_update(RETRY_STATE, (retry, job_id), job_id)

    def flush(self) -> None:
        self._deferred.queue_all()  # the rows of leases so far, then wait for all of it
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
        return self._rows.prune(now_wall)

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
        self._schedules.save_schedule(schedule)

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        self._schedules.update_schedule(schedule_id, state)

    def delete_schedule(self, schedule_id: str) -> None:
        self._schedules.delete_schedule(schedule_id)

    def save_limit(self, name: str, form: str | None) -> None:
        self._schedules.save_limit(name, form)

    def saved_limits(self) -> dict[str, str]:
        return self._schedules.saved_limits()

    def schedules(self) -> list[StoredSchedule]:
        return self._schedules.schedules()
