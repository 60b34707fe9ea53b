"""SharedSubmits: how a manager submits jobs to a queue that several managers share in Redis.

A submit is the write: the jobs are due on the server's clock, and Redis checks the
bounds (max_pending, max_pending_bytes) against every manager's jobs. A submit to a full
queue tries again (FULL_RETRY) until its timeout. One whose answer was lost is sent again,
as such, until Redis says whether it took the first (DOUBT_WAIT at most).
"""

from __future__ import annotations

import time

from mpsched._core.job import DEFAULT_QUEUE, After, JobRequest, check_request
from mpsched._core.retrying import RetryState
from mpsched._core.room import check_fits
from mpsched._errors import (
    InvalidJobError,
    PayloadTooLargeError,
    QueueFullError,
    StoreInDoubtError,
    StoreUnavailableError,
)
from mpsched._manager.shared_queue import SharedQueue
from mpsched._payload.segments import Segments
from mpsched._store.redis.records import NewJob
from mpsched._store.redis.store import RedisStore

FULL_RETRY = (0.01, 0.2)  # a submit to a full queue tries again after these (doubling)
# How long a submit whose answer was lost is sent again, until Redis says whether it took
# the first (a resent batch is taken once: RedisStore.submit_jobs's ``again``).
DOUBT_WAIT = 30.0


class SharedSubmits:
    """The submits of one manager to a shared queue (see the module docstring)."""

    def __init__(self, store: RedisStore, queue: SharedQueue) -> None:
        self._store = store
        self._queue = queue
        self._me = queue.manager_id
        # This manager's shared-memory segments (SharedJournal.hold_segments): a job
        # submitted with one goes to Redis inline and keeps its segment here.
        self.segments = Segments()

    def submit_after(self, requests: list[JobRequest], afters: list[After]) -> None:
        """As SharedJournal.submit_after."""
        for request in requests:
            check_request(request)
            if request.queue != DEFAULT_QUEUE or request.limit is not None:
                raise InvalidJobError(
                    "a job with parents (after=, ResultOf) takes no queue= or limit= with "
                    "a Redis store yet: it runs in the default queue, without a limit"
                )
        requests, _held = self.segments.for_store(requests)
        self._check_sizes(requests)
        jobs = _new_jobs(requests, set(), keyed=False)
        self._store.submit_after(jobs, afters, self._me)

    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        """As SharedJournal.submit."""
        for request in requests:
            check_request(request)
        requests, held = self.segments.for_store(requests)
        self._check_sizes(requests)
        max_pending = self._queue.max_pending
        max_bytes = self._queue.max_pending_bytes
        check_fits(len(requests), sum(len(r.payload) for r in requests), max_pending, max_bytes)
        jobs = _new_jobs(requests, held, keyed=True)
        run = due is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = FULL_RETRY[0]
        while True:
            holders, full = self._submit_once(jobs, run, max_pending, max_bytes)
            if full is None:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                bound = max_pending if full == "jobs" else max_bytes
                assert bound is not None
                raise QueueFullError(bound, timeout, full)
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, FULL_RETRY[1])
        same = all(h == r.job_id for h, r in zip(holders, requests, strict=True))
        return None if same and not run else holders

    def _check_sizes(self, requests: list[JobRequest]) -> None:
        """Raises PayloadTooLargeError for a payload Redis cannot hold."""
        for request in requests:
            if len(request.payload) > self._store.max_payload:
                raise PayloadTooLargeError(
                    len(request.payload),
                    self._store.max_payload,
                    f"the Redis store {self._store.location}",
                )

    def _submit_once(
        self, jobs: list[NewJob], run: bool, max_pending: int | None, max_bytes: int | None
    ) -> tuple[list[str], str | None]:
        """One submit of ``jobs``; one whose answer was lost is sent again (as such) until
        Redis answers, for DOUBT_WAIT at most: it says whether the first was taken.

        Raises:
            StoreInDoubtError: Redis did not answer again within DOUBT_WAIT.
            StoreUnavailableError: it was not sent: nothing was added.
        """
        try:
            return self._store.submit_jobs(
                jobs,
                self._me,
                if_absent=run,
                max_pending=max_pending,
                max_pending_bytes=max_bytes,
            )
        except StoreInDoubtError as doubt:
            error = doubt
        deadline = time.monotonic() + DOUBT_WAIT
        pause = FULL_RETRY[1]
        while time.monotonic() < deadline:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 1.0)
            try:
                return self._store.submit_jobs(
                    jobs,
                    self._me,
                    if_absent=run,
                    max_pending=max_pending,
                    max_pending_bytes=max_bytes,
                    again=True,
                )
            except StoreUnavailableError as exc:
                if isinstance(exc, StoreInDoubtError):
                    error = exc
        ids = ", ".join(job.job_id for job in jobs[:5]) + (", ..." if len(jobs) > 5 else "")
        raise StoreInDoubtError(
            self._store.location,
            f"{error.reason}; the job(s) {ids} may "
            f"be queued and may run: look them up by id "
            f"(Client.job); with key= a job may be submitted again",
        )


def _new_jobs(requests: list[JobRequest], held: set[str], *, keyed: bool) -> list[NewJob]:
    """The records Redis stores for ``requests`` (``held``: the ids of the jobs whose
    segments this manager keeps). ``keyed`` False: jobs with parents, which take no key."""
    return [
        NewJob(
            job_id=r.job_id,
            client_id=r.client_id,
            key=r.key if keyed else None,
            name=r.name,
            payload=r.payload,
            priority=r.priority,
            delay=r.delay,
            at=r.at,
            timeout=r.timeout,
            retries=r.retries,
            held=r.job_id in held,
            retry=None if r.retry is None else RetryState(r.retry).encode(),
            queue=r.queue,
            limit=r.limit,
        )
        for r in requests
    ]
