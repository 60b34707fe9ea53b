"""EndedJobs: the jobs a manager without a store remembers after they end.

A store keeps a finished job's record and outcome for ``result_ttl``, so its id can be
looked up (``client.job``, ``result``, ``jobs``) after it ended. Without a store the manager
keeps them in memory for ``result_ttl`` too, within bounds, so that ids mean the same with
and without one: at most ``MAX_JOBS`` ended jobs and ``MAX_BYTES`` of their outcomes, the
oldest dropped first; an outcome larger than ``MAX_OUTCOME``, or whose result went through
shared memory (gone once its client took it), is not kept, only that the job ended. A
failed or cancelled job keeps its arguments (its payload, counted in ``MAX_BYTES``) so it
can be requeued by id; a done job's are dropped at once.

No lock of its own: NoJournal (mpsched._manager.journal) calls every method with its lock held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from mpsched._core.job import Job, JobState, Outcome
from mpsched._payload import frames

MAX_JOBS = 100_000
MAX_BYTES = 64 * 2**20  # of outcomes (result or error payloads and tracebacks)
MAX_OUTCOME = 2**20  # an outcome larger than this is not kept, only that the job ended


class Ended(NamedTuple):
    """An ended job as EndedJobs keeps it."""

    job: Job  # the queue's record, without its payload
    state: JobState
    worker_id: str | None  # who ran it last
    finished_wall: float
    outcome: Outcome | None  # None when it was not kept (too large, or in shared memory)
    kept_until: float  # on the monotonic clock
    size: int  # bytes it counts against MAX_BYTES


class EndedJobs:
    """Ended jobs by id, oldest first, for ``ttl`` seconds on ``clock`` (monotonic)."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._ended: OrderedDict[str, Ended] = OrderedDict()
        self._bytes = 0
        self._oldest_until = 0.0  # kept_until of the oldest entry, as last looked at

    def __len__(self) -> int:
        return len(self._ended)

    def add_locked(
        self, job: Job, state: JobState, worker_id: str | None, wall: float, outcome: Outcome | None
    ) -> Sequence[Ended]:
        """Remember ``job``, ended in ``state`` (its outcome, if any, kept when it may be);
        returns the jobs forgotten to make room, or because their time was up. With a
        ``ttl`` of 0 nothing is remembered: ``job`` comes back at once."""
        now = self._clock()
        if self._ttl <= 0:
            return [
                Ended(
                    job=job,
                    state=state,
                    worker_id=worker_id,
                    finished_wall=wall,
                    outcome=None,
                    kept_until=now,
                    size=0,
                )
            ]
        size = 0 if outcome is None else len(outcome.payload) + len(outcome.traceback)
        if outcome is not None and (size > MAX_OUTCOME or frames.segment_of(outcome.payload)):
            outcome, size = None, 0
        if state is JobState.DONE or frames.segment_of(job.payload):
            job.payload = b""  # it will not run again: the arguments are not needed
        else:  # failed or cancelled: it may be requeued (Client.requeue), with them
            size += len(job.payload)
        ended = self._ended
        old = ended.pop(job.job_id, None)
        if old is not None:
            self._bytes -= old.size
        ended[job.job_id] = Ended(
            job=job,
            state=state,
            worker_id=worker_id,
            finished_wall=wall,
            outcome=outcome,
            kept_until=now + self._ttl,
            size=size,
        )
        self._bytes += size
        if now < self._oldest_until and len(ended) <= MAX_JOBS and self._bytes <= MAX_BYTES:
            return ()  # nothing to forget: the usual case, without looking at the oldest
        return self._expire_locked(now)

    def get_locked(self, job_id: str) -> Ended | None:
        """The ended job ``job_id``, if it is still kept."""
        ended = self._ended.get(job_id)
        if ended is None or ended.kept_until <= self._clock():
            return None
        return ended

    def ended_locked(self, job_id: str) -> bool | None:
        """True while the ended job ``job_id`` is kept, False once its time is up, None
        for a job not (or no longer) remembered: one that has not ended."""
        ended = self._ended.get(job_id)
        return None if ended is None else ended.kept_until > self._clock()

    def all_locked(self) -> list[Ended]:
        """Every ended job still kept, oldest first."""
        now = self._clock()
        return [e for e in self._ended.values() if e.kept_until > now]

    def forget_locked(self, job_id: str) -> Ended | None:
        """Forget the ended job ``job_id`` now (it is requeued); returns it if it was kept."""
        return self._forget_locked(job_id)

    def _forget_locked(self, job_id: str) -> Ended | None:
        old = self._ended.pop(job_id, None)
        if old is not None:
            self._bytes -= old.size
        return old

    def _expire_locked(self, now: float) -> list[Ended]:
        dropped: list[Ended] = []
        while self._ended:
            oldest = next(iter(self._ended.values()))
            if (
                len(self._ended) <= MAX_JOBS
                and self._bytes <= MAX_BYTES
                and oldest.kept_until > now
            ):
                self._oldest_until = oldest.kept_until
                break
            self._forget_locked(oldest.job.job_id)
            dropped.append(oldest)
        return dropped
