"""What a SQLite store recovers: at opening, the lease log folded into SQLite; for a manager
that restarts, its pending and running jobs as SQLite and the lease log leave them."""

from __future__ import annotations

import sqlite3

from mpsched._store.base import Recovery, RunningJob, StoredJob
from mpsched._store.lease_log import LeaseLog
from mpsched._store.lease_records import LogRecord, split
from mpsched._store.readers import Readers, no_gc
from mpsched._store.statements import FOLD, FOLD_END, STORED, stored_job
from mpsched._store.writer import Writer


def fold_leases(leases: LeaseLog, writer: Writer) -> None:
    """Apply the lease log's last lease or requeue of each job to SQLite, and then the
    ends it has, then empty the log. An end whose outcome the log does not carry (too
    large, and not yet committed when the manager died) leaves the job ended, without
    an outcome (its watchers are told it was lost)."""
    moves, ends = split(leases.read())
    rows = [
        ("running" if r.running else "pending", r.worker_id, r.attempt, job_id)
        for job_id, r in moves.items()
    ]
    end_rows = [(str(r.ended), r.outcome, r.finished_wall, job_id) for job_id, r in ends.items()]
    if rows or end_rows:

        def fold(conn: sqlite3.Connection) -> None:
            conn.executemany(FOLD, rows)
            conn.executemany(FOLD_END, end_rows)

        writer.call(fold, len(rows) + len(end_rows))
    leases.reset()


def recover(readers: Readers, leases: LeaseLog) -> Recovery:
    """The pending and running jobs, the next seq and the retry states, from one snapshot
    of SQLite overlaid with the lease log's records."""
    with readers.connection() as conn, no_gc():
        conn.execute("BEGIN")  # one snapshot for the three reads
        try:
            pending = list(
                map(
                    stored_job,
                    conn.execute(f"SELECT {STORED} FROM jobs WHERE state = 'pending' ORDER BY seq"),
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
    records = leases.read()
    if records:  # leases and requeues SQLite may not have yet
        pending, running = _overlay(records, pending, running)
    return Recovery(
        pending=pending,
        running=running,
        next_seq=0 if last is None else last + 1,
        retry=retry or None,
    )


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
