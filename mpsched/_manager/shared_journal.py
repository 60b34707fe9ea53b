"""SharedJournal: the journal of a manager whose queue lives in Redis.

With a journal store (mpsched._manager.journal) the manager's heap decides and the store
records. With Redis the store decides (its scripts order, claim and fence), so this
journal has little to write: a submit is the write (due on the server's clock), a claim
recorded the lease, and a finish is written here under the lease's fencing token, then
handed to the clients. What it keeps is this manager's clients' interest in jobs: their
own, and those they watch, which may end on any manager. Those ends arrive in this
manager's inbox (mpsched._manager.shared_link drains it) and are delivered from here.

A finish that Redis refuses (the lease went stale: this manager was presumed dead and a
peer took the job back) is logged and never delivered: the job's record is whatever the
peer made of it.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable

from mpsched._core.job import (
    After,
    Assignment,
    Job,
    JobRecord,
    JobRequest,
    JobState,
    Outcome,
    OutcomeKind,
)
from mpsched._core.retrying import RetryState
from mpsched._errors import (
    DependencyFailedError,
    JobError,
    JobNotFoundError,
    StoreUnavailableError,
    WorkerCrashedError,
)
from mpsched._manager.journal import (
    BaseJournal,
    cancelled,
    decode,
    encode,
    not_requeueable,
)
from mpsched._manager.shared_queue import SharedQueue
from mpsched._manager.shared_submits import SharedSubmits
from mpsched._payload import frames, shm
from mpsched._payload.segments import Segments
from mpsched._protocol.records import ManagerStatus, WorkerStatus
from mpsched._store.redis.records import AFTER, Finish, StoredEnd, retry_end
from mpsched._store.redis.store import RedisStore

log = logging.getLogger("mpsched.manager")

# How the service hands an outcome to a client and the other clients watching its job.
Deliver = Callable[[str, Outcome, set[str]], None]


class SharedJournal(BaseJournal):
    """Journals this manager's part of a shared queue and delivers its clients' ends."""

    shared = True

    def __init__(
        self, store: RedisStore, queue: SharedQueue, wall: Callable[[], float] = time.time
    ) -> None:
        super().__init__(store, queue)
        self.store: RedisStore = store
        self.shared_queue = queue
        self.manager_id = queue.manager_id
        self._wall = wall
        self._deliver: Deliver = lambda client, outcome, watchers: None
        # Under the base class's lock: finishes Redis could not take (it was down), sent
        # again by the link (mpsched._manager.shared_link), in order.
        self._unsent: list[Finish] = []
        self._segments = Segments()  # none until hold_segments()
        self._submits = SharedSubmits(store, queue)

    def hold_segments(self, segments: Segments) -> None:
        """This manager's shared-memory segments: a job submitted here with a segment
        goes to Redis inline and keeps its segment here for this manager's workers
        (mpsched._payload.segments), until its end comes here."""
        self._segments = self._submits.segments = segments
        self.shared_queue.on_held_payload(segments.held_payload)

    @property
    def max_payload(self) -> int | None:
        return self.store.max_payload

    def bind(self, deliver: Deliver) -> None:
        """How ends that arrive from other managers reach this manager's clients."""
        self._deliver = deliver

    # ------------------------------------------------------------------ changes

    def submit_after(self, requests: list[JobRequest], afters: list[After]) -> None:
        """Submit jobs that wait for their parents to Redis, all or none: each becomes
        due once its last parent ended, whichever manager ends it (after.lua).

        Raises:
            InvalidJobError: as check_request; PayloadTooLargeError; an id in the store.
            JobNotFoundError: a parent the store does not know.
            StoreUnavailableError, StoreError: Redis did not take them.
        """
        self._submits.submit_after(requests, afters)

    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        """Submit to Redis, due on its clock. ``due`` set: a schedule's run (its ``at``
        is its slot), created once however many managers arm it.

        Raises:
            InvalidJobError: as check_request; PayloadTooLargeError for a payload Redis
                cannot hold; an id already in the store; a batch larger than
                ``max_pending`` or ``max_pending_bytes`` (it could never fit).
            QueueFullError: no room under ``max_pending`` jobs pending in Redis, or under
                ``max_pending_bytes`` bytes of their stored payloads, within ``timeout``
                seconds.
            StoreUnavailableError, StoreError: Redis did not take them; nothing was added.
            StoreInDoubtError: Redis took the batch and its answer was lost, and it did
                not answer again within DOUBT_WAIT: the jobs may be queued.
        """
        return self._submits.submit(requests, timeout, due)

    def lease(self, assignment: Assignment) -> bool:
        return True  # the claim recorded it

    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str] | None:
        """Record a job's end under its lease, as a take of one that hands it in (the
        worker's next job is claimed in the same call, unless it left); the local clients
        to tell, or None when Redis refused it (a stale lease: never delivered)."""
        return self.finished_all([(job, outcome)], worker_id, more=0)[0]

    def finished_all(
        self, ends: list[tuple[Job, Outcome]], worker_id: str | None = None, more: int | None = None
    ) -> list[set[str] | None]:
        """Record the ends of jobs one worker ran, in one call to Redis (which claims that
        worker's next jobs too: SharedQueue.report_ends); for each, as :meth:`finished`."""
        finishes: list[Finish | None] = []
        for job, outcome in ends:
            token = self.shared_queue.pop_token(job.job_id)
            finishes.append(
                None
                if token is None
                else Finish(
                    job_id=job.job_id,
                    token=token,
                    state=JobState.DONE if outcome.ok else JobState.FAILED,
                    outcome=encode(self._stored(outcome)),
                    retry=None
                    if job.notes is None or outcome.ok
                    else RetryState(job.retry, job.error, job.notes).encode(),
                )
            )
        sent = [f for f in finishes if f is not None]
        if not sent:
            return [None] * len(ends)
        try:
            results = iter(self.shared_queue.report_ends(sent, worker_id, more))
        except StoreUnavailableError:
            with self._lock:
                self._unsent += sent
            self.shared_queue.outage.held("end(s) of jobs", len(sent))
            return [None if f is None else self._ended_here(f.job_id) for f in finishes]
        watchers: list[set[str] | None] = []
        for finish in finishes:
            if finish is None:
                watchers.append(None)
            elif (result := next(results)) == 0:
                log.warning(
                    "job %s ended on worker %s, but its lease had run out and "
                    "another manager took the job back: this end is not recorded",
                    finish.job_id,
                    worker_id,
                )
                watchers.append(None)
            else:
                if result == 3:
                    log_revived(finish.job_id)
                watchers.append(self._ended_here(finish.job_id))
        return watchers

    def _stored(self, outcome: Outcome) -> Outcome:
        """``outcome`` as Redis keeps it: a result a local worker wrote into shared
        memory is read back to go inline (its segment stays, for a client here)."""
        if not frames.segment_of(outcome.payload):
            return outcome
        try:
            return outcome._replace(payload=shm.inline(outcome.payload))
        except OSError as exc:
            log.error(
                "the result of job %s cannot be read from shared memory (%s); the "
                "store keeps a result other managers cannot read",
                outcome.job_id,
                exc,
            )
            return outcome

    def _ended_here(self, job_id: str) -> set[str]:
        with self._lock:
            return self._watchers.pop(job_id, set())

    def requeued(self, job: Job) -> None:
        pass  # SharedQueue.requeue put it back in Redis

    def retried(self, job: Job, delay: float, cause: str) -> None:
        """Put back in Redis a job whose attempt failed, under its lease's token: its
        lease ends and it is due ``delay`` seconds from now on the server's clock, in one
        step (finish() in common.lua). A stale lease changes nothing: the job was taken
        back, and its attempt counted, by another manager."""
        token = self.shared_queue.pop_token(job.job_id)
        if token is None:
            return
        state = RetryState(job.retry, job.error, job.notes).encode()
        finish = Finish(
            job_id=job.job_id,
            token=token,
            state=JobState.PENDING,
            outcome=retry_end(delay, cause, state),
        )
        try:
            [result] = self.shared_queue.report_ends([finish], None, None)
        except StoreUnavailableError:
            with self._lock:
                self._unsent.append(finish)
            self.shared_queue.outage.held("end(s) of jobs", 1)
            return
        if result == 0:
            log.warning(
                "job %s failed an attempt, but its lease had run out and another "
                "manager took the job back: this end is not recorded",
                job.job_id,
            )

    def requeue_ended(self, client_id: str, job_id: str) -> None:
        """As BaseJournal.requeue_ended, in one script: this manager delivers its end."""
        done = self.store.requeue_ended(self.manager_id, job_id, client_id)
        if done == "unknown":
            raise JobNotFoundError(job_id)
        if not isinstance(done, int):
            why = {
                "no-payload": "its arguments were not kept",
                "key": "its key is held by another job",
            }.get(done, f"it is {done}")
            raise not_requeueable(job_id, why)

    def progress(self, lease_id: int, job_id: str, progress: str) -> None:
        """Write a job's latest progress to its hash in Redis (field ``pg``), under its
        lease's token, where every manager's listing reads it."""
        token = self.shared_queue.token_of(job_id)
        if token is not None:
            self.store.set_progress([(job_id, token, progress)])
            self.shared_queue.note_progress(lease_id, job_id, progress)

    def take_unsent(self) -> list[Finish]:
        """The finishes Redis could not take yet, oldest first (the caller sends them, or
        gives them back with :meth:`put_back_unsent`)."""
        with self._lock:
            unsent, self._unsent = self._unsent, []
            return unsent

    def put_back_unsent(self, finishes: list[Finish]) -> None:
        with self._lock:
            self._unsent[:0] = finishes

    def has_unsent(self) -> bool:
        with self._lock:
            return bool(self._unsent)

    # ------------------------------------------------------------------ ends from elsewhere

    def deliver_ended(self, ended: list[StoredEnd]) -> None:
        """Hand ends that other managers recorded (this manager's inbox) to the clients
        here that submitted or watch them."""
        for end in ended:
            with self._lock:
                watchers = self._watchers.pop(end.job_id, set())
            self._segments.ended([end.job_id])  # it ran elsewhere, or was cancelled there
            # Its own client is served here only if this manager is its owner; posting
            # to a client that is not connected here drops nothing anyone waits for.
            self._deliver(end.client_id, outcome_of(end), watchers)

    # ------------------------------------------------------------------ lookups

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        with self._lock:
            self._watch_locked(client_id, job_id)
        try:
            ended = self.store.watch(self.manager_id, job_id)
        except BaseException:
            with self._lock:
                self._unwatch_locked(client_id, job_id)
            raise
        if ended is not None and ended.state in (JobState.PENDING, JobState.RUNNING):
            return None  # its end will be handed over
        with self._lock:
            handed = not self._unwatch_locked(client_id, job_id)
        if ended is None:
            raise JobNotFoundError(job_id)
        return None if handed else outcome_of(ended)

    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        return self.store.get(job_id)

    def adopt(self, run_id: str) -> bool | None:
        """As BaseJournal.adopt; a run pending or running is watched from here from now
        on, so that this manager hears of its end wherever it runs."""
        ended = self.store.watch(self.manager_id, run_id)
        if ended is None:
            return None
        return ended.state in (JobState.PENDING, JobState.RUNNING)

    def schedule_changed(self, schedule_id: str) -> None:
        self.store.publish_schedule(schedule_id)

    def managers(self, live: tuple[WorkerStatus, ...] = ()) -> tuple[ManagerStatus, ...]:
        """Every live manager of the store, as its last heartbeat described it; this one
        with its workers as they are now (``live``)."""
        found = []
        for record in self.store.managers():
            try:
                host, pid, address, workers = pickle.loads(record.status)
            except Exception:  # a manager of another version, or one still starting
                host, pid, address, workers = "?", 0, "", ()
            mine = record.manager_id == self.manager_id
            found.append(
                ManagerStatus(
                    manager_id=record.manager_id,
                    host=host,
                    pid=pid,
                    address=address,
                    heartbeat_age=record.seen_ago,
                    lease_timeout=record.lease_timeout,
                    workers=live if mine else tuple(workers),
                    workers_age=0.0 if mine else record.seen_ago,
                )
            )
        return tuple(found)

    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        return self.store.jobs(None if state is None else JobState(state), limit)


def log_revived(job_id: str) -> None:
    """Say that a job's end replaced the failure a peer recorded (Reply.finished 3)."""
    log.warning(
        "job %s ran to its end here while this manager was presumed dead, and a "
        "peer had failed it: its end replaces that failure",
        job_id,
    )


def encode_status(host: str, pid: int, address: str, workers: tuple[WorkerStatus, ...]) -> bytes:
    """A manager's status as its heartbeats publish it (``managers`` reads it back)."""
    return pickle.dumps((host, pid, address, workers), protocol=pickle.HIGHEST_PROTOCOL)


def outcome_of(end: StoredEnd) -> Outcome:
    """The outcome a client gets of a job that ended as ``end`` says."""
    if end.state is JobState.CANCELLED:
        return cancelled(end.job_id)
    if end.outcome:
        return decode(end.outcome)
    if end.crashed_worker is not None and end.crashed_worker.startswith(AFTER):
        parent, _, how = end.crashed_worker[len(AFTER) :].rpartition("|")
        failed = DependencyFailedError(end.job_id, parent, how)
        return Outcome(
            end.job_id, False, pickle.dumps(failed), "", None, OutcomeKind.DEPENDENCY_FAILED.value
        )
    if end.crashed_worker is not None:
        error = WorkerCrashedError(end.job_id, end.crashed_worker, None)
        return Outcome(end.job_id, False, pickle.dumps(error), "", None, type(error).__name__)
    error_ = JobError(f"job {end.job_id} ended, but its outcome is no longer kept (result_ttl)")
    return Outcome(end.job_id, False, pickle.dumps(error_), "", None, "outcome-not-kept")
