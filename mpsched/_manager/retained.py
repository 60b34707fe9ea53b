"""EndedJobs: the jobs a manager without a store remembers after they end.

A store keeps a finished job's record and outcome for ``result_ttl``, so its id can be
looked up (``client.job``, ``result``, ``jobs``) after it ended. Without a store the manager
keeps them in memory for ``result_ttl`` too, within bounds, so that ids mean the same with
and without one: at most ``MAX_JOBS`` ended jobs and ``MAX_BYTES`` of their outcomes, the
oldest dropped first; an outcome larger than ``MAX_OUTCOME``, or whose result went through
shared memory (gone once its client took it), is not kept, only that the job ended. A
failed or cancelled job keeps its arguments (its payload, counted in ``MAX_BYTES``) so it
can be requeued by id; a done job's are dropped at once.

Each ended job is kept as plain tuples of strings, numbers and bytes (``_Kept``), not as
the queue's Job and Outcome objects: CPython's cyclic garbage collector stops tracking such
tuples, so a full collection in the manager does not walk the (up to ``MAX_JOBS``) jobs
kept here. Kept as objects, 100,000 of them made each full collection pause the manager
for 120-180 ms (benchmarks/README.md). Lookups build an ``Ended`` again.

No lock of its own: NoJournal (mpsched._manager.journal) calls every method with its lock held.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, cast

from mpsched._core.job import Job, JobState, Outcome
from mpsched._core.retrying import RetryTerms
from mpsched._payload import frames

MAX_JOBS = 100_000
MAX_BYTES = 64 * 2**20  # of outcomes (result or error payloads and tracebacks)
MAX_OUTCOME = 2**20  # an outcome larger than this is not kept, only that the job ended


class Ended(NamedTuple):
    """An ended job as EndedJobs gives it back."""

    job: Job  # the queue's record, without its payload
    state: JobState
    worker_id: str | None  # who ran it last
    finished_wall: float
    outcome: Outcome | None  # None when it was not kept (too large, or in shared memory)
    kept_until: float  # on the monotonic clock
    size: int  # bytes it counts against MAX_BYTES


# A kept job: (Job's fields in order, its state's value, worker_id, finished_wall, the
# Outcome's fields or None, kept_until, size). Every item is a str, a number, None, bytes,
# a bytearray or a tuple of those: none of them is tracked by the garbage collector.
_Kept = tuple[tuple[object, ...], str, str | None, float, tuple[object, ...] | None, float, int]
_STATE: Final = 1
_UNTIL: Final = 5
_SIZE: Final = 6
_STATES = {state.value: state for state in JobState}
_SEQ = 5  # in a kept job's fields


def _keep(
    job: Job,
    state: JobState,
    worker_id: str | None,
    wall: float,
    outcome: Outcome | None,
    until: float,
    size: int,
) -> _Kept:
    """``job`` as kept: its fields in Job's order, as ``Job(*fields)`` takes them back.
    Written out, not an ``attrgetter`` of the names (twice the time): it runs for every
    job that ends. A field added to Job goes here too (tests/manager/test_collector.py)."""
    retry, notes = job.retry, job.notes
    fields = (
        job.job_id,
        job.client_id,
        job.payload,
        job.priority,
        job.due,
        job.seq,
        job.timeout,
        job.retries,
        job.attempt,
        job.cancelled,
        job.key,
        job.name,
        job.at,
        None if retry is None else tuple(retry),  # a NamedTuple: tracked
        job.error,
        None if notes is None else tuple(notes),  # a list: tracked
        job.progress,
        job.queue,
        job.limit,
    )
    return (
        fields,
        state._value_,  # not .value, a property: this is every job's path
        worker_id,
        wall,
        None if outcome is None else tuple(outcome),
        until,
        size,
    )


def _ended(kept: _Kept) -> Ended:
    fields, state, worker_id, wall, outcome, until, size = kept
    job = Job(*fields)  # type: ignore[arg-type]
    if job.retry is not None:
        job.retry = RetryTerms(*job.retry)
    if job.notes is not None:
        job.notes = list(job.notes)
    return Ended(
        job=job,
        state=_STATES[state],
        worker_id=worker_id,
        finished_wall=wall,
        outcome=None if outcome is None else Outcome(*outcome),  # type: ignore[arg-type]
        kept_until=until,
        size=size,
    )


class EndedJobs:
    """Ended jobs by id, oldest first, for ``ttl`` seconds on ``clock`` (monotonic)."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._ended: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self._oldest_until = 0.0  # kept_until of the oldest entry, as last looked at

    def __len__(self) -> int:
        return len(self._ended)

    def add_locked(
        self, job: Job, state: JobState, worker_id: str | None, wall: float, outcome: Outcome | None
    ) -> Sequence[str]:
        """Remember ``job``, ended in ``state`` (its outcome, if any, kept when it may be);
        returns the ids of the jobs forgotten to make room, or because their time was up.
        With a ``ttl`` of 0 nothing is remembered: ``job``'s id comes back at once."""
        if self._ttl <= 0:
            return (job.job_id,)
        now = self._clock()
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
            self._bytes -= old[_SIZE]
        ended[job.job_id] = _keep(job, state, worker_id, wall, outcome, now + self._ttl, size)
        self._bytes += size
        if now < self._oldest_until and len(ended) <= MAX_JOBS and self._bytes <= MAX_BYTES:
            return ()  # nothing to forget: the usual case, without looking at the oldest
        return self._expire_locked(now)

    def get_locked(self, job_id: str) -> Ended | None:
        """The ended job ``job_id``, if it is still kept."""
        kept = self._ended.get(job_id)
        if kept is None or kept[_UNTIL] <= self._clock():
            return None
        return _ended(kept)

    def ended_locked(self, job_id: str) -> bool | None:
        """True while the ended job ``job_id`` is kept, False once its time is up, None
        for a job not (or no longer) remembered: one that has not ended."""
        kept = self._ended.get(job_id)
        return None if kept is None else kept[_UNTIL] > self._clock()

    def all_locked(self, state: JobState | None = None, limit: int | None = None) -> list[Ended]:
        """Every ended job still kept (in ``state``, if given), oldest first; with
        ``limit``, only the ``limit`` first submitted of them."""
        now = self._clock()
        wanted = None if state is None else state.value
        kept = [
            k
            for k in self._ended.values()
            if k[_UNTIL] > now and (wanted is None or k[_STATE] == wanted)
        ]
        if limit is not None:
            kept = heapq.nsmallest(limit, kept, key=lambda k: cast(int, k[0][_SEQ]))
        return [_ended(k) for k in kept]

    def forget_locked(self, job_id: str) -> Ended | None:
        """Forget the ended job ``job_id`` now (it is requeued); returns it if it was kept."""
        old = self._ended.pop(job_id, None)
        if old is None:
            return None
        self._bytes -= old[_SIZE]
        return _ended(old)

    def _expire_locked(self, now: float) -> list[str]:
        dropped: list[str] = []
        ended = self._ended
        while ended:
            job_id, oldest = next(iter(ended.items()))
            if len(ended) <= MAX_JOBS and self._bytes <= MAX_BYTES and oldest[_UNTIL] > now:
                self._oldest_until = oldest[_UNTIL]
                break
            del ended[job_id]
            self._bytes -= oldest[_SIZE]
            dropped.append(job_id)
        return dropped
