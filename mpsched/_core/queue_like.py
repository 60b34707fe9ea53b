"""JobQueueLike: what a manager needs from the queue it serves.

Two queues have this surface: JobQueue (mpsched._core.queue), a heap in this process's
memory, and SharedQueue (mpsched._manager.shared_queue), this manager's side of a queue
that lives in Redis. The manager names this Protocol, never either class, except where
only one of them can stand (a store's journal, a workflow's blocked jobs).

What a manager needs, by role:

- taking: ``take_batch``, ``return_lease``, ``revoke``;
- ends of jobs: ``complete``, ``retry``, ``fail``, ``requeue``, ``release_worker``,
  ``retire_if_leased``, ``expired``, ``wait_drained``, and ``leases``, the in-flight table
  of this manager's workers;
- cancels and moves: ``check_routes``, ``count_withdrawn``, ``cancel_jobs``,
  ``cancel_client_jobs``, ``not_due``, ``reschedule``;
- limits: ``limits``, ``set_limit``, ``waiting_for``;
- reads for status pages: ``head``, ``len()``, ``stats``, ``pending_by_queue``, ``clock``,
  ``max_pending``, ``max_pending_bytes``;
- its life: ``set_on_returned``, ``close``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mpsched._core.clock import Clock
from mpsched._core.job import Assignment, Job, JobRequest, Lease, Outcome, QueueStats
from mpsched._core.leases import Leases, LostLease
from mpsched._core.limits import LimitSpec
from mpsched._core.queues import Queues


class JobQueueLike(Protocol):
    """A queue a manager serves: jobs handed to its workers under leases, and ended."""

    leases: Leases  # the jobs in flight with this manager's workers

    @property
    def clock(self) -> Clock:
        """The clock due times are kept on."""

    @property
    def max_pending(self) -> int | None:
        """The bound on pending jobs; None: no bound."""

    @property
    def max_pending_bytes(self) -> int | None:
        """The bound on what pending payloads hold; None: no bound."""

    # ------------------------------------------------------------------------ take

    def take_batch(
        self,
        worker_id: str,
        timeout: float,
        early: float = 0.0,
        more: int = 0,
        prefetchable: Callable[[Job], bool] | None = None,
        queues: Queues = None,
    ) -> list[Assignment]:
        """Hand ``worker_id`` the next due job under a new lease, waiting at most
        ``timeout`` seconds, and up to ``more`` due jobs more, prefetched.

        ``early``: hand a job out up to this many seconds before it is due. The taker must
            then wait for ``Assignment.due`` itself (only one on this monotonic clock can).
        ``prefetchable``: which jobs may be prefetched (None: any).
        ``queues``: the queues the taker serves, in order (None: every queue). It gets the
            due jobs of the first of them that has one.

        Returns:
            The assignments in the order to start them; [] when none came due in time.
        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """

    def return_lease(self, lease_id: int) -> Job | None:
        """Take back a job just handed out that must not run (its lease could not be
        journalled): it goes back as never received. Returns the job."""

    def revoke(self, worker_id: str) -> int:
        """Take back the prefetched jobs ``worker_id`` has not started (it leaves); they go
        back as never received. Returns how many did."""

    # ------------------------------------------------------------------ ends of jobs

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        """End a lease with its worker's outcome; the job, or None if it had ended.
        ``worker_id``: the worker reporting it (it started its batch up to this lease)."""

    def retry(
        self,
        lease_id: int,
        outcome: Outcome,
        worker_id: str,
        delay_of: Callable[[Job], float | None],
    ) -> tuple[Job | None, float | None]:
        """End a lease whose job failed in a way that may run again, and in the same step
        put the job back, due ``delay_of(job)`` seconds from now. When that is None, or
        the queue is closed, end it as :meth:`complete` does.

        Returns:
            The job (None for a lease that had ended) and the delay (None: it ended).
        """

    def fail(self, job: Job, *, timed_out: bool = False) -> None:
        """Count as failed a job whose lease ended (or was lost) and that will not run
        again; ``timed_out``: it ran past its timeout."""

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put back a job whose lease was lost. ``retry``: the worker had received it, so
        this is another attempt; otherwise it never started and no attempt is counted.
        Returns False when the job stays out (the queue is closed, or refused it)."""

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds (it died or went away) and return them. The
        worker id is retired: a take still running for it gets no job."""

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        """Retire ``worker_id`` (no take hands it a job again) if ``lease_id`` is still in
        flight; True if it was. Its leases end when it is seen to exit (release_worker).
        A worker to be killed for a job past its timeout is retired first, so the kill
        runs outside the queue's lock and never hits a job taken after the late one."""

    def expired(self) -> tuple[list[Lease], float | None]:
        """Leases past their job's timeout, and the earliest deadline still ahead."""

    def wait_drained(self, timeout: float) -> bool:
        """Wait until no job is in flight; False if some still are after ``timeout``."""

    # -------------------------------------------------------------- cancels, moves

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Raises InvalidJobError when a request names a queue or a limit that is not
        valid, or a limit that is not declared."""

    def count_withdrawn(self, count: int) -> None:
        """Count jobs a client cancelled before sending them: submitted, then cancelled
        (and jobs cancelled while they waited for their parents)."""

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Remove the pending jobs among ``job_ids``; returns them. A prefetched job its
        worker has not started is taken back first, and removed too."""

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """Remove every pending job of one client (with ``not_due_only``, only those
        whose due time is still ahead); returns the jobs removed."""

    def not_due(self, client_id: str) -> list[str]:
        """The ids of one client's pending jobs whose due time is still ahead."""

    def reschedule(self, job_id: str, due: float) -> bool:
        """Move a pending job to another due time on this queue's clock, keeping its seq
        (a cron run after the wall clock jumped); False when it was not moved."""

    # ----------------------------------------------------------------------- limits

    def limits(self) -> dict[str, LimitSpec]:
        """The limits jobs may name, by name."""

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) remove a limit."""

    def waiting_for(self, job_id: str) -> str | None:
        """``"limit NAME"`` for a pending job parked behind its full limit; else None."""

    # ------------------------------------------------------------------------ reads

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order takers would get them, without taking
        any. The Jobs are listings: read them only."""

    def __len__(self) -> int:
        """The number of pending jobs."""

    def stats(self, *, lateness: bool = True) -> QueueStats:
        """Counters, pending jobs per priority and recent lateness percentiles (with
        ``lateness`` False, none: ``QueueStats.lateness`` is empty, and no sample is
        copied or sorted)."""

    def pending_by_queue(self) -> dict[str, int]:
        """Pending jobs per queue."""

    # ---------------------------------------------------------------------- its life

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Set who is told of each job a revocation put back, before any taker can get it
        again; called with the queue's lock held, so it must not block."""

    def close(self) -> None:
        """Stop: every waiting or future take raises SchedulerShutdownError."""
