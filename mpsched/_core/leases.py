"""Leases: which jobs are in flight, with which worker, until when; and how jobs ended.

A job leaves JobQueue's heap and gets its lease in one step, so this table shares the
queue's lock: methods that end in ``_locked`` are called by JobQueue and its parts with
that lock held, the others take it themselves. Pure, like the queue: clock injected, no
multiprocessing.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from mpsched._core.clock import Clock
from mpsched._core.histogram import LATENESS_BOUNDS, Histogram, HistogramSnapshot
from mpsched._core.job import Assignment, Job, Lease, Outcome

# How long a released worker's id is remembered: a take that was already on its way when
# the worker was released returns nothing instead of a job (the manager bounds every take
# by its long poll, a few seconds).
GONE_MEMORY = 120.0

# How many recent lateness samples stats() summarises.
LATENESS_SAMPLES = 10_000


class LostLease(NamedTuple):
    """A lease ended because its worker went away, with whether it was past its timeout."""

    job: Job
    lease: Lease
    past_deadline: bool


class Running(NamedTuple):
    """A job in flight, with its lease and when it was handed out (the queue's clock)."""

    job: Job
    lease: Lease
    taken: float


@dataclass(slots=True)
class _InFlight:
    job: Job
    lease: Lease
    taken: float
    deadline: float | None  # taken + job.timeout


@dataclass(frozen=True)
class Outcomes:
    """How the jobs that left the table ended (part of QueueStats)."""

    in_flight: int
    completed: int
    failed: int
    timed_out: int
    started_early: int
    recent: list[float]  # the recent lateness samples (empty when not asked for)
    lateness_samples: int  # how many recent samples there are
    crashed: int  # of ``failed``: lost with their worker and not run again (no timeout)


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p90/p99/max of ``samples`` (nearest rank); zeros when there are none."""
    if not samples:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(samples)
    last = len(ordered) - 1

    def rank(q: float) -> float:
        return ordered[min(last, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": ordered[last]}


class Leases:
    """The in-flight table of one JobQueue, guarded by that queue's ``lock``."""

    def __init__(self, lock: threading.Lock, clock: Clock) -> None:
        self._lock = lock  # JobQueue's: guards every field below
        self._clock = clock
        # A stopping manager waits here (wait_drained) for in-flight jobs to end; notified
        # (all) whenever the table becomes empty while someone waits.
        self._drained = clock.condition(lock)
        self._drain_waiters = 0  # threads inside wait_drained: only then is it notified
        self._in_flight: dict[int, _InFlight] = {}
        # Released workers (by id, with when) whose takes never get a job again; kept for
        # GONE_MEMORY seconds, far longer than a take that was already under way can last.
        self._gone: dict[str, float] = {}
        self._by_job: dict[str, _InFlight] = {}  # the same entries, by job id
        self._next_id = 1  # the id of the next lease granted (ids only grow)
        self._lateness: deque[float] = deque(maxlen=LATENESS_SAMPLES)
        self._completed = self._failed = self._timed_out = self._crashed = 0
        # Every lateness since the start, in fixed buckets (a Prometheus histogram).
        self._lateness_buckets = Histogram(LATENESS_BOUNDS)
        self._early = 0  # jobs that started before their due time: a bug if ever non-zero
        # Told (lock held) of each ended lease of a job under a limit: its slot frees.
        self.on_limited_end: Callable[[Job], None] | None = None

    def grant_locked(self, job: Job, worker_id: str, now: float) -> Assignment:
        """Put ``job`` (just popped from the heap) in flight with ``worker_id``."""
        job.attempt += 1
        lease = Lease(
            lease_id=self._next_id, job_id=job.job_id, worker_id=worker_id, attempt=job.attempt
        )
        self._next_id += 1
        deadline = None if job.timeout is None else now + job.timeout
        self._in_flight[lease.lease_id] = self._by_job[job.job_id] = _InFlight(
            job=job, lease=lease, taken=now, deadline=deadline
        )
        return Assignment(
            lease=lease, payload=job.payload, due=job.due, timeout=job.timeout, at=job.at
        )

    def hold_locked(self, job: Job, worker_id: str, now: float) -> None:
        """Put ``job`` in flight with ``worker_id`` as the attempt it already is: a job a
        store says ran on that worker when the manager before this one died."""
        job.attempt -= 1
        self.grant_locked(job, worker_id, now)

    def next_id_locked(self) -> int:
        """The id the next lease granted gets: every lease granted so far has a lower one."""
        return self._next_id

    def drop_locked(self, lease_id: int) -> Job | None:
        """End a lease without an outcome (the job goes back to the heap)."""
        flight = self._end_locked(lease_id)
        return None if flight is None else flight.job

    def retire_locked(self, worker_id: str, now: float) -> None:
        """No take hands ``worker_id`` a job again (it died, went away, or is about to be
        killed); remembered for GONE_MEMORY seconds."""
        self._gone.pop(worker_id, None)  # keep the dict in time order
        self._gone[worker_id] = now
        for old, when in list(self._gone.items()):
            if when >= now - GONE_MEMORY:
                break  # insertion order is time order
            del self._gone[old]

    def retired_locked(self, worker_id: str) -> bool:
        return worker_id in self._gone

    def release_worker_locked(self, worker_id: str, now: float) -> list[LostLease]:
        """Retire ``worker_id`` and end every lease it holds; returns them."""
        self.retire_locked(worker_id, now)
        lost = [
            LostLease(
                job=f.job, lease=f.lease, past_deadline=f.deadline is not None and f.deadline <= now
            )
            for f in self._in_flight.values()
            if f.lease.worker_id == worker_id
        ]
        for entry in lost:
            self._end_locked(entry.lease.lease_id)
        return lost

    def lease_of(self, job_id: str) -> Lease | None:
        """The lease of the job ``job_id`` if it is in flight; takes the lock."""
        with self._lock:
            flight = self._by_job.get(job_id)
            return None if flight is None else flight.lease

    def job_of(self, job_id: str) -> Job | None:
        """The job ``job_id`` if it is in flight (the queue's record: read it only); takes
        the lock."""
        with self._lock:
            flight = self._by_job.get(job_id)
            return None if flight is None else flight.job

    def find_locked(self, job_id: str) -> tuple[Job, Lease] | None:
        """The job in flight under ``job_id``, with its lease."""
        flight = self._by_job.get(job_id)
        return None if flight is None else (flight.job, flight.lease)

    def set_progress_locked(self, lease_id: int, job_id: str, progress: str) -> bool:
        """Note the progress of ``job_id`` if it is in flight under ``lease_id``."""
        flight = self._by_job.get(job_id)
        if flight is None or flight.lease.lease_id != lease_id:
            return False
        flight.job.progress = progress
        return True

    def jobs_locked(self) -> list[tuple[Job, Lease]]:
        """Every job in flight, with its lease."""
        return [(f.job, f.lease) for f in self._in_flight.values()]

    def _end_locked(self, lease_id: int) -> _InFlight | None:
        flight = self._in_flight.pop(lease_id, None)
        if flight is None:
            return None
        if self._by_job.get(flight.job.job_id) is flight:  # its id may be in flight twice
            del self._by_job[flight.job.job_id]
        if flight.job.limit is not None and self.on_limited_end is not None:
            self.on_limited_end(flight.job)
        if self._drain_waiters and not self._in_flight:
            self._drained.notify_all()
        return flight

    def complete(self, lease_id: int, outcome: Outcome) -> Job | None:
        """End a lease with the job's outcome. Returns the job, or None for an unknown lease.

        A lease the manager already ended (its worker was declared dead) is unknown, so a
        late report can never resolve a job twice.
        """
        with self._lock:
            return self.complete_locked(lease_id, outcome)

    def complete_locked(self, lease_id: int, outcome: Outcome, *, final: bool = True) -> Job | None:
        """:meth:`complete`, with the lock held. Not ``final``: the job runs again (a
        retry), so it counts neither as completed nor as failed."""
        flight = self._end_locked(lease_id)
        if flight is None:
            return None
        if not final:
            pass
        elif outcome.ok:
            self._completed += 1
        else:
            self._failed += 1
        if outcome.started is not None:
            lateness = outcome.started - flight.job.due
            self._lateness.append(max(0.0, lateness))
            self._lateness_buckets.observe(max(0.0, lateness))
            self._early += lateness < 0
        return flight.job

    def fail(self, job: Job, *, timed_out: bool = False, crashed: bool = True) -> None:
        """Count as failed a job whose lease was lost and that will not run again
        (``crashed`` False: one that never ran, its parent failed)."""
        with self._lock:
            self._failed += 1
            self._timed_out += timed_out
            self._crashed += crashed and not timed_out

    def wait_drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no job is in flight; True if none is."""
        with self._lock:
            deadline = self._clock.now() + timeout
            while self._in_flight:
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    return False
                self._drain_waiters += 1
                try:
                    self._drained.wait(min(remaining, threading.TIMEOUT_MAX))
                finally:
                    self._drain_waiters -= 1
            return True

    def job_locked(self, lease_id: int) -> Job | None:
        """The job in flight under ``lease_id``, or None for a lease that ended."""
        flight = self._in_flight.get(lease_id)
        return None if flight is None else flight.job

    def holds_locked(self, lease_id: int) -> bool:
        """True while ``lease_id`` is in flight."""
        return lease_id in self._in_flight

    def expired(self, now: float | None = None) -> tuple[list[Lease], float | None]:
        """Leases past their job's timeout, and the earliest deadline still ahead."""
        with self._lock:
            now = self._clock.now() if now is None else now
            late = [
                f.lease
                for f in self._in_flight.values()
                if f.deadline is not None and f.deadline <= now
            ]
            ahead = [
                f.deadline
                for f in self._in_flight.values()
                if f.deadline is not None and f.deadline > now
            ]
            return late, min(ahead, default=None)

    def held(self) -> list[Lease]:
        """The leases currently held."""
        with self._lock:
            return [f.lease for f in self._in_flight.values()]

    def running(self) -> list[Running]:
        """Every job in flight, with its lease and when it was handed out."""
        with self._lock:
            return [
                Running(job=f.job, lease=f.lease, taken=f.taken) for f in self._in_flight.values()
            ]

    def lateness_histogram(self) -> HistogramSnapshot:
        """The lateness (due to start, seconds) of every job reported on this queue's clock
        since the start, in fixed buckets."""
        with self._lock:
            return self._lateness_buckets.snapshot()

    def outcomes_locked(self, *, samples: bool = True) -> Outcomes:
        """The counts, and (``samples``) a copy of the recent lateness samples: the caller
        summarises them after releasing the lock (sorting 10,000 takes milliseconds)."""
        return Outcomes(
            in_flight=len(self._in_flight),
            completed=self._completed,
            failed=self._failed,
            timed_out=self._timed_out,
            started_early=self._early,
            recent=list(self._lateness) if samples else [],
            lateness_samples=len(self._lateness),
            crashed=self._crashed,
        )
