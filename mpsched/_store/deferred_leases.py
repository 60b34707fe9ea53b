"""The leases of a SQLite store whose row is not queued yet. The lease log journals a lease
at once; its row rides in the writer's op for the job's next change (its finish, requeue
or retry), or is queued by the next flush, whichever comes first."""

from __future__ import annotations

import threading

from mpsched._core.job import JobState
from mpsched._store.statements import FINISH, FINISH_LEASED, LEASE, REQUEUE, RETRIED
from mpsched._store.writer import Writer


class DeferredLeases:
    """Leases whose row waits for the job's next change or a flush; those ops are queued here."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        # Guards _leased and orders the writer's ops on a job with them: leases whose row
        # is not queued yet (job id -> worker, attempt). Their row is queued with the job's
        # finish, or at a flush. Taken after the lease log's lock, never before it.
        self._leased_lock = threading.Lock()
        self._leased: dict[str, tuple[str, int]] = {}

    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        """Hold the row of a lease the log has journalled."""
        with self._leased_lock:
            self._leased[job_id] = (worker_id, attempt)

    def finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        """Queue a job's end, with its lease's row if that is held here (one row update)."""
        ended = (state.value, outcome, finished_wall)
        with self._leased_lock:
            leased = self._leased.pop(job_id, None)
            if leased is None:
                self._writer.post_update(FINISH.one, (*ended, job_id), job_id)
            else:  # one row update for the lease and its end
                self._writer.post_update(FINISH_LEASED.one, (*ended, *leased, job_id), job_id)

    def requeue(self, job_id: str, attempt: int) -> None:
        """Queue a job put back pending; its lease's row, if held, is dropped."""
        with self._leased_lock:
            self._leased.pop(job_id, None)
            self._writer.post_update(REQUEUE.one, (attempt, job_id), job_id)

    def retried(self, job_id: str, attempt: int, due_wall: float, retry: str) -> None:
        """Queue a job put back for a retry at ``due_wall``; its lease's row is dropped."""
        with self._leased_lock:
            self._leased.pop(job_id, None)
            self._writer.post_update(RETRIED.one, (attempt, due_wall, retry, job_id), job_id)

    def queue_all(self) -> None:
        """Queue the rows of every lease held so far (a flush waits for them next)."""
        with self._leased_lock:
            leased, self._leased = self._leased, {}
            for job_id, (worker_id, attempt) in leased.items():
                self._writer.post_update(LEASE.one, (worker_id, attempt, job_id), job_id)
