"""MemoryStore: the Store of a manager configured without one, in its own memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mpsched._core.job import JobRecord, JobState
from mpsched._errors import InvalidJobError, StoreError
from mpsched._store.base import (
    IN_MEMORY,
    JournalStore,
    Recovery,
    RunningJob,
    StoredJob,
    StoredSchedule,
    check_finish_state,
    check_options,
    record_of,
)


@dataclass(slots=True)
class _Entry:
    job: StoredJob  # as submitted: ``attempt`` below is the current count
    state: JobState
    attempt: int = 0
    worker_id: str | None = None
    finished_wall: float | None = None
    outcome: bytes | None = None
    progress: str | None = None

    def current(self) -> StoredJob:
        return self.job._replace(attempt=self.attempt)

    def record(self, *, with_outcome: bool = True) -> JobRecord:
        listed = with_outcome or self.state is JobState.FAILED  # its error is listed
        return record_of(
            self.current(),
            self.state,
            self.worker_id,
            self.finished_wall,
            self.outcome if listed else None,
        )._replace(progress=self.progress)


class MemoryStore(JournalStore):
    """The store of a manager without one: the same semantics, in this process's memory.

    Nothing survives the process, so ``recover`` of a new MemoryStore returns nothing. With
    the default ``result_ttl=0`` a finished or cancelled job is forgotten at once (no
    outcome is kept, its key is free again): a manager without a store keeps no history, so
    its memory stays bounded by what is pending and running. With ``result_ttl > 0`` finished
    jobs are kept as a SQLiteStore keeps them. Every call takes effect before it returns.
    """

    def __init__(self, *, result_ttl: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        check_options(result_ttl)
        self._result_ttl = float(result_ttl)
        self._clock = clock  # wall clock: when a retained job expires
        # Guards every field below; held briefly by each call, never while waiting.
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._keys: dict[str, str] = {}  # key -> id of the job holding it
        self._seqs: set[int] = set()  # the seqs of the entries: one job per seq, as in SQLite
        self._schedules: dict[str, StoredSchedule] = {}  # insertion order is save order
        self._closed = False

    @property
    def location(self) -> str:
        return IN_MEMORY

    def size(self) -> int | None:
        return None

    @property
    def keeps_outcomes(self) -> bool:
        return self._result_ttl > 0

    def recover(self) -> Recovery:
        with self._lock:
            self._check_open_locked()
            entries = sorted(self._entries.values(), key=lambda e: e.job.seq)
            seqs = [e.job.seq for e in entries]
            return Recovery(
                pending=[e.current() for e in entries if e.state is JobState.PENDING],
                running=[
                    RunningJob(job=e.current(), worker_id=e.worker_id or "")
                    for e in entries
                    if e.state is JobState.RUNNING
                ],
                next_seq=max(seqs) + 1 if seqs else 0,
            )

    def submit(
        self, jobs: Sequence[StoredJob], retry: Mapping[str, str] | None = None
    ) -> list[str]:
        with self._lock:
            self._check_open_locked()
            ids = self._resolve_keys_locked(jobs)
            new = [job for job, job_id in zip(jobs, ids, strict=True) if job_id == job.job_id]
            if (
                len({job.job_id for job in new}) < len(new)
                or len({job.seq for job in new}) < len(new)
                or any(j.job_id in self._entries or j.seq in self._seqs for j in new)
            ):
                raise InvalidJobError("a job id or seq repeats one in the batch or the store")
            for job in new:
                self._entries[job.job_id] = _Entry(job, JobState.PENDING, job.attempt)
                self._seqs.add(job.seq)
                if job.key is not None:
                    self._keys[job.key] = job.job_id
            return ids

    def _resolve_keys_locked(self, jobs: Sequence[StoredJob]) -> list[str]:
        """For each job, the id of the job holding its key, or its own id."""
        now = self._clock()
        held: dict[str, str] = {}
        ids: list[str] = []
        for job in jobs:
            holder = (
                None
                if job.key is None
                else (held.get(job.key) or self._holder_locked(job.key, now))
            )
            if holder is None and job.key is not None:
                held[job.key] = job.job_id
            ids.append(job.job_id if holder is None else holder)
        return ids

    def cancel(self, job_ids: Sequence[str], finished_wall: float) -> None:
        with self._lock:
            self._check_open_locked()
            for job_id in job_ids:
                entry = self._entries.get(job_id)
                if entry is not None and entry.state is JobState.PENDING:
                    self._end_locked(entry, JobState.CANCELLED, None, finished_wall)

    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                entry.state, entry.worker_id, entry.attempt = JobState.RUNNING, worker_id, attempt

    def finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        check_finish_state(state)
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                self._end_locked(entry, state, outcome, finished_wall)

    def requeue(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                entry.state, entry.worker_id, entry.attempt = JobState.PENDING, None, attempt

    def requeue_ended(
        self, job_id: str, client_id: str, due_wall: float
    ) -> tuple[StoredJob, str | None] | None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is None or entry.state not in (JobState.FAILED, JobState.CANCELLED):
                return None
            key = entry.job.key
            if key is not None and self._keys.get(key, job_id) != job_id:
                raise InvalidJobError(
                    f"job {job_id} cannot be requeued: its key {key!r} is "
                    f"held by job {self._keys[key]}"
                )
            if key is not None:
                self._keys[key] = job_id
            entry.job = entry.job._replace(client_id=client_id, due_wall=due_wall)
            entry.state, entry.attempt, entry.worker_id = JobState.PENDING, 0, None
            entry.finished_wall = entry.outcome = entry.progress = None
            return entry.current(), None

    def set_progress(self, job_id: str, progress: str) -> None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                entry.progress = progress

    def flush(self) -> None:
        with self._lock:
            self._check_open_locked()

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            entry = self._entries.get(job_id)
            return None if entry is None else entry.record()

    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        with self._lock:
            entries = sorted(
                (e for e in self._entries.values() if state is None or e.state is state),
                key=lambda e: e.job.seq,
            )
            return [e.record(with_outcome=False) for e in entries[:limit]]

    def find_key(self, key: str) -> JobRecord | None:
        with self._lock:
            holder = self._holder_locked(key, self._clock())
            return None if holder is None else self._entries[holder].record()

    def prune(self, now_wall: float) -> int:
        with self._lock:
            expired = [e for e in self._entries.values() if self._expired(e, now_wall)]
            for entry in expired:
                self._forget_locked(entry)
            return len(expired)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open_locked(self) -> None:
        if self._closed:
            raise StoreError(IN_MEMORY, "the store is closed")

    def save_schedule(self, schedule: StoredSchedule) -> None:
        with self._lock:
            self._check_open_locked()
            self._schedules[schedule.schedule_id] = schedule

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        with self._lock:
            old = self._schedules.get(schedule_id)
            if old is not None:
                self._schedules[schedule_id] = old._replace(state=state)

    def delete_schedule(self, schedule_id: str) -> None:
        with self._lock:
            self._schedules.pop(schedule_id, None)

    def schedules(self) -> list[StoredSchedule]:
        with self._lock:
            return list(self._schedules.values())

    def _expired(self, entry: _Entry, now_wall: float) -> bool:
        return (
            entry.finished_wall is not None and entry.finished_wall <= now_wall - self._result_ttl
        )

    def _holder_locked(self, key: str, now_wall: float) -> str | None:
        """The id of the job holding ``key``; an expired holder is forgotten here."""
        job_id = self._keys.get(key)
        if job_id is None:
            return None
        entry = self._entries[job_id]
        if self._expired(entry, now_wall):
            self._forget_locked(entry)
            return None
        return job_id

    def _end_locked(
        self, entry: _Entry, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        entry.state, entry.outcome, entry.finished_wall = state, outcome, finished_wall
        if state is JobState.CANCELLED and entry.job.key is not None:
            self._keys.pop(entry.job.key, None)
        if self._result_ttl == 0:
            self._forget_locked(entry)

    def _forget_locked(self, entry: _Entry) -> None:
        del self._entries[entry.job.job_id]
        self._seqs.discard(entry.job.seq)
        key = entry.job.key
        if key is not None and self._keys.get(key) == entry.job.job_id:
            del self._keys[key]
