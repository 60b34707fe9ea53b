"""PendingJobs: the heaps of pending jobs, their order and their lazy deletion.

No lock of its own: JobQueue (mpsched._core.queue) owns one instance, and it and its parts
call every method with its lock held. Jobs wait in ``delayed``, keyed ``(due, level, seq)``; with
``order="priority"`` the jobs already due move to ``ready``, keyed ``(level, due, seq)``.
A cancelled job is marked, not searched for: a heap drops it when it reaches the top, and
both heaps are rebuilt once stale entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from mpsched._core.job import Job, Order, Payload, Priority

COMPACT_AFTER = 1024  # stale entries tolerated before the heaps are rebuilt


class PendingJobs:
    """The pending jobs of one queue, in heap order; call with the queue's lock held."""

    def __init__(self, order: Order, sizer: Callable[[Payload], int] | None) -> None:
        """``sizer``: what a payload counts against ``max_pending_bytes`` (None: unbounded,
        nothing is counted)."""
        self._order = order
        self._sizer = sizer
        self._delayed: list[tuple[float, int, int, Job]] = []
        self._ready: list[tuple[int, float, int, Job]] = []
        self._live: dict[str, Job] = {}  # heaps hold cancelled entries too
        self._stale = 0  # cancelled entries still in a heap
        self.levels = dict.fromkeys((p.level for p in Priority), 0)  # live jobs per level
        self.bytes = 0  # what live payloads count against max_pending_bytes

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._live

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._live.values()))

    def get(self, job_id: str) -> Job | None:
        return self._live.get(job_id)

    def head(self) -> Job | None:
        """The job at the top of the delayed heap (cancelled or not), to tell a new head."""
        return self._delayed[0][3] if self._delayed else None

    def push(self, job: Job) -> None:
        self._count(job, +1)
        heapq.heappush(self._delayed, (job.due, job.priority, job.seq, job))

    def restore(self, jobs: Iterable[Job]) -> None:
        """Add many jobs at once (recovery): one heapify instead of a push each."""
        for job in jobs:
            self._count(job, +1)
            self._delayed.append((job.due, job.priority, job.seq, job))
        heapq.heapify(self._delayed)

    def remove(self, job_id: str) -> Job | None:
        """Take a live job out (cancel): marked, dropped from the heaps lazily."""
        job = self._live.get(job_id)
        if job is not None:
            self._discard(job)
        return job

    def head_due(self) -> float | None:
        """When the earliest pending job is due (None: nothing pending)."""
        self._drop_stale_heads()
        return self._delayed[0][0] if self._delayed else None

    def has_ready(self) -> bool:
        """Jobs wait in the ready heap: due already (``order="priority"``)."""
        self._drop_stale_heads()
        return bool(self._ready)

    def pop_due(self, now: float, early: float = 0.0) -> Job | None:
        """The next job for a taker that may get one ``early`` seconds before it is due."""
        self._drop_stale_heads()
        if self._order is Order.TIME:
            if self._delayed and self._delayed[0][0] <= now + early:
                return self._taken(heapq.heappop(self._delayed)[3])
            return None
        self._promote(now)
        if self._ready:
            return self._taken(heapq.heappop(self._ready)[3])
        if early and self._delayed and self._delayed[0][0] <= now + early:
            return self._taken(heapq.heappop(self._delayed)[3])
        return None

    def peek_due(self, now: float, early: float = 0.0) -> Job | None:
        """The job :meth:`pop_due` would return, left in place."""
        self._drop_stale_heads()
        if self._order is Order.TIME:
            if self._delayed and self._delayed[0][0] <= now + early:
                return self._delayed[0][3]
            return None
        self._promote(now)
        if self._ready:
            return self._ready[0][3]
        if early and self._delayed and self._delayed[0][0] <= now + early:
            return self._delayed[0][3]
        return None

    def pop_first(self) -> Job | None:
        """The first live job in this heap's order, due or not, out of it."""
        self._drop_stale_heads()
        if self._ready:
            return self._taken(heapq.heappop(self._ready)[3])
        if self._delayed:
            return self._taken(heapq.heappop(self._delayed)[3])
        return None

    def due_head(self, now: float) -> Job | None:
        """The job :meth:`pop_due` would return now with no ``early``, left in place."""
        self._drop_stale_heads()
        if self._order is Order.TIME:
            due = self._delayed and self._delayed[0][0] <= now
            return self._delayed[0][3] if due else None
        self._promote(now)
        return self._ready[0][3] if self._ready else None

    def _promote(self, now: float) -> None:
        """``order="priority"``: move the jobs due by ``now`` to the ready heap. Only jobs
        really due move there: a job in it is due for every taker, including one that must
        never get a job early (a worker on another clock)."""
        while self._delayed and self._delayed[0][0] <= now:
            job = heapq.heappop(self._delayed)[3]
            if job.cancelled:
                self._stale -= 1
            else:
                heapq.heappush(self._ready, (job.priority, job.due, job.seq, job))
        self._drop_stale_heads()

    def key(self, job: Job) -> tuple[float | int, ...]:
        """Where ``job`` goes among due jobs (this queue's order): lower goes first."""
        return job.time_key() if self._order is Order.TIME else job.priority_key()

    def sorts_before(self, a: Job, b: Job) -> bool:
        """Whether ``a`` goes before ``b`` when both are due (this queue's order)."""
        return self.key(a) < self.key(b)

    def first(self, n: int) -> list[Job]:
        """Up to ``n`` live jobs in the order takers would get them (the ready heap's,
        then the delayed heap's), without popping any: O(n log n), whatever the heaps hold."""
        jobs = _smallest(self._ready, n)
        return jobs + _smallest(self._delayed, n - len(jobs))

    def _taken(self, job: Job) -> Job:
        self._count(job, -1)
        return job

    def _discard(self, job: Job) -> None:
        job.cancelled = True
        self._stale += 1
        self._count(job, -1)
        self._drop_stale_heads()
        if self._stale > COMPACT_AFTER and self._stale > len(self._live):
            self._delayed = [e for e in self._delayed if not e[3].cancelled]
            self._ready = [e for e in self._ready if not e[3].cancelled]
            heapq.heapify(self._delayed)
            heapq.heapify(self._ready)
            self._stale = 0

    def _count(self, job: Job, sign: int) -> None:
        if sign > 0:
            self._live[job.job_id] = job
        else:
            del self._live[job.job_id]
        self.levels[job.priority] += sign
        if self._sizer is not None:
            self.bytes += sign * self._sizer(job.payload)

    def _drop_stale_heads(self) -> None:
        while self._delayed and self._delayed[0][3].cancelled:
            heapq.heappop(self._delayed)
            self._stale -= 1
        while self._ready and self._ready[0][3].cancelled:
            heapq.heappop(self._ready)
            self._stale -= 1


def _smallest(heap: Sequence[tuple[Any, Any, Any, Job]], n: int) -> list[Job]:
    """The ``n`` smallest live entries of ``heap``, in order: a walk from the top that
    only ever looks at the children of what it took (a heap's k smallest)."""
    jobs: list[Job] = []
    frontier = [(heap[0], 0)] if heap and n > 0 else []
    while frontier and len(jobs) < n:
        entry, index = heapq.heappop(frontier)
        if not entry[3].cancelled:
            jobs.append(entry[3])
        for child in (2 * index + 1, 2 * index + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))
    return jobs
