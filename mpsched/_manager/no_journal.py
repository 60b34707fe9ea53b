"""NoJournal: the journal of a manager without a store.

It stands in for ``Journal`` (mpsched._manager.store_journal) and makes no call per job
beyond what the queue does anyway. Lookups by id and listings are answered from the
queue's own records: pending and in-flight jobs, and ended ones kept in memory, bounded,
for ``result_ttl``. It keeps the keys of live jobs so that ``key=`` works the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from mpsched._core.job import Job, JobRecord, JobRequest, JobState, Outcome, check_request
from mpsched._core.queue import JobQueue
from mpsched._errors import JobNotFoundError
from mpsched._manager.journal import (
    BaseJournal,
    cancelled,
    encode,
    not_kept,
    not_requeueable,
    request_again,
)
from mpsched._manager.retained import Ended, EndedJobs
from mpsched._protocol.records import LONG_POLL
from mpsched._store.memory import MemoryStore


class WaitingJobs(Protocol):
    """The jobs waiting for their parents, out of the heap (mpsched._manager.workflows)."""

    def find(self, job_id: str) -> tuple[Job, int] | None: ...

    def listing(self) -> list[tuple[Job, int]]: ...


class NoJournal(BaseJournal):
    """The journal of a manager without a store: nothing is written, nothing survives it.

    Lookups and listings see the jobs pending or in flight (the queue's records), and for
    ``result_ttl`` seconds those that ended, with their outcomes, in memory and bounded
    (mpsched._manager.retained). Keys: a job with a ``key`` holds it while it is pending, running,
    or kept ended (done or failed; a cancelled one frees it). Schedules are kept in a
    MemoryStore.
    """

    def __init__(
        self, queue: JobQueue, wall: Callable[[], float] = time.time, result_ttl: float = 0.0
    ) -> None:
        super().__init__(MemoryStore(), queue)
        self.queue: JobQueue = queue
        self._wall = wall
        # Under the base class's lock: key -> the id of the job holding it, and back; the
        # jobs that ended.
        self._holders: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._ended = EndedJobs(result_ttl, queue.clock.now)
        self._keeps = result_ttl > 0  # ended jobs are kept at all
        self.waiting_jobs: WaitingJobs | None = None  # set by the service

    def _find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending, waiting for its parents (worker None) or running."""
        found = self.queue.find(job_id)
        if found is None and self.waiting_jobs is not None:
            waiting = self.waiting_jobs.find(job_id)
            return None if waiting is None else (waiting[0], None)
        return found

    def outcome_of(self, job_id: str) -> Outcome:
        with self._lock:
            ended = self._ended.get_locked(job_id)
        if ended is not None and ended.outcome is not None:
            return ended.outcome
        return not_kept(job_id)

    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        if all(r.key is None for r in requests):
            self.queue.submit_many(requests, timeout, due=due, refuse_running=True)
            return None
        for request in requests:
            check_request(request)  # before any key is taken
        holders, fresh = self._take_keys(requests)
        try:
            self.queue.submit_many(fresh, timeout, due=due, checked=True, refuse_running=True)
        except BaseException:
            with self._lock:
                for request in fresh:
                    self._release_key_locked(request.job_id)
            raise
        return None if len(fresh) == len(requests) else holders

    def _take_keys(self, requests: list[JobRequest]) -> tuple[list[str], list[JobRequest]]:
        """For each request, the id of the job holding its key (its own when it takes the
        key), and the requests to queue. A key is held from here on, so a concurrent
        submit of the same key finds it taken even before this batch is in the heap."""
        holders: list[str] = []
        fresh: list[JobRequest] = []
        with self._lock:
            for request in requests:
                holder = None if request.key is None else self._holders.get(request.key)
                if holder is not None and not self._holds_locked(holder):
                    self._release_key_locked(holder)  # it ended, and is no longer kept
                    holder = None
                if holder is None:
                    if request.key is not None:
                        self._holders[request.key] = request.job_id
                        self._keys[request.job_id] = request.key
                    fresh.append(request)
                holders.append(request.job_id if holder is None else holder)
        return holders, fresh

    def _holds_locked(self, job_id: str) -> bool:
        """Whether a job that took a key still holds it: queued (or on its way there),
        running, or ended and still kept (a cancelled one has let go of it already)."""
        kept = self._ended.ended_locked(job_id)
        return kept is None or kept

    def cancelled(self, jobs: list[Job]) -> dict[str, set[str]]:
        with self._lock:
            for job in jobs:
                if self._keys:
                    self._release_key_locked(job.job_id)
                if self._keeps:
                    self._forgotten_locked(
                        self._ended.add_locked(
                            job, JobState.CANCELLED, None, self._wall(), cancelled(job.job_id)
                        )
                    )
            return {job.job_id: w for job in jobs if (w := self._watchers.pop(job.job_id, None))}

    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str]:
        with self._lock:
            if self._keeps:
                self._forgotten_locked(
                    self._ended.add_locked(
                        job,
                        JobState.DONE if outcome.ok else JobState.FAILED,
                        worker_id,
                        self._wall(),
                        outcome,
                    )
                )
            elif job.key is not None:
                self._release_key_locked(job.job_id)
            return self._watchers.pop(job.job_id, set()) if self._watchers else set()

    def _forgotten_locked(self, dropped: Sequence[str]) -> None:
        """Ended jobs no longer kept (by id) let go of their keys."""
        if dropped and self._keys:
            for job_id in dropped:
                self._release_key_locked(job_id)

    def requeued(self, job: Job) -> None:
        pass  # nothing is journalled: the job is back in the heap, which is the record

    def requeue_ended(self, client_id: str, job_id: str) -> None:
        with self._lock:
            ended = self._ended.get_locked(job_id)
            if ended is None:
                found = self.queue.find(job_id)
                if found is not None:
                    state = JobState.PENDING if found[1] is None else JobState.RUNNING
                    raise not_requeueable(job_id, f"it is {state}")
                raise JobNotFoundError(job_id)
            if ended.state is JobState.DONE:
                raise not_requeueable(job_id, "it is done")
            job = ended.job
            if not job.payload:
                raise not_requeueable(
                    job_id, "its arguments were not kept (they went through shared memory)"
                )
            self._ended.forget_locked(job_id)
            if self._keys:
                self._release_key_locked(job_id)
        request = request_again(job, client_id)
        try:
            holders = self.submit([request], LONG_POLL)
        except BaseException:
            self._keep_again(ended)
            raise
        if holders is not None:
            self._keep_again(ended)
            raise not_requeueable(job_id, f"its key is held by job {holders[0]}")

    def _keep_again(self, ended: Ended) -> None:
        """Keep an ended job whose requeue failed as it was."""
        with self._lock:
            self._forgotten_locked(
                self._ended.add_locked(
                    ended.job, ended.state, ended.worker_id, ended.finished_wall, ended.outcome
                )
            )

    def _release_key_locked(self, job_id: str) -> None:
        key = self._keys.pop(job_id, None)
        if key is not None and self._holders.get(key) == job_id:
            del self._holders[key]

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        with self._lock:
            ended = self._ended.get_locked(job_id)
            if ended is not None:
                return ended.outcome if ended.outcome is not None else not_kept(job_id)
            if self._find(job_id) is None:
                raise JobNotFoundError(job_id)
            self._watch_locked(client_id, job_id)
            return None

    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        found = self._find(job_id)
        if found is not None:
            job, worker_id = found
            return self._record(job, worker_id)
        with self._lock:
            ended = self._ended.get_locked(job_id)
        return None if ended is None else self._ended_record(ended)

    def owner(self, job_id: str) -> str | None:
        found = self._find(job_id)
        if found is not None:
            job, _worker = found
            return job.client_id
        with self._lock:
            ended = self._ended.get_locked(job_id)
        return None if ended is None else ended.job.client_id

    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        wanted = None if state is None else JobState(state)
        ended: list[Ended] = []
        if wanted is None or wanted.finished:
            with self._lock:
                ended = self._ended.all_locked(wanted, limit)
        # Ended jobs alone: no copy of every pending one (a million of them, maybe); and
        # records only for the jobs listed, the first ``limit`` chosen before.
        live = self.queue.jobs(wanted, limit) if wanted is None or not wanted.finished else []
        records = [self._record(job, worker) for job, worker in live]
        if self.waiting_jobs is not None and wanted in (None, JobState.PENDING):
            records += [self._record(job, None) for job, _n in self.waiting_jobs.listing()]
        records += [self._ended_record(e) for e in ended]
        records.sort(key=lambda record: record.seq)
        return records[:limit]

    def _record(
        self,
        job: Job,
        worker_id: str | None,
        state: JobState | None = None,
        finished_wall: float | None = None,
    ) -> JobRecord:
        to_wall = self._wall() - self.queue.clock.now()
        return JobRecord(
            job_id=job.job_id,
            client_id=job.client_id,
            key=job.key,
            name=job.name,
            priority=job.priority,
            due_wall=job.due + to_wall,
            seq=job.seq,
            timeout=job.timeout,
            retries=job.retries,
            attempt=job.attempt,
            submitted_wall=job.due + to_wall,  # not kept without a store: its due time
            state=state or (JobState.PENDING if worker_id is None else JobState.RUNNING),
            worker_id=worker_id,
            finished_wall=finished_wall,
            outcome=None,
            error=job.error,
            progress=job.progress,
            queue=job.queue,
            limit=job.limit,
        )

    def _ended_record(self, ended: Ended) -> JobRecord:
        record = self._record(ended.job, ended.worker_id, ended.state, ended.finished_wall)
        if ended.state is JobState.FAILED and ended.outcome is not None:
            return record._replace(outcome=encode(ended.outcome))
        return record
