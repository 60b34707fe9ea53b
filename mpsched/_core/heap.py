"""PendingJobs: the heaps of pending jobs, their order and their lazy deletion.

No lock of its own: JobQueue (mpsched._core.queue) owns one instance, and it and its parts
call every method with its lock held. Jobs wait in ``delayed``, keyed ``(due, level, seq)``; with
``order="priority"`` the jobs already due move to ``ready``, keyed ``(level, due, seq)``.
A cancelled job is marked, not searched for: a heap drops it when it reaches the top, and
both heaps are rebuilt once stale entries outnumber live ones.

An entry holds its job's id, not the Job: a tuple of strings and numbers, which the
garbage collector stops tracking, so a full collection in the manager walks one object
per pending job, not two. The Job is in ``_live``; an entry is stale once its id is not
there, or names a job of another seq or due time (the same job moved: ``reschedule``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from mpsched._core.job import Job, Order, Payload, Priority

COMPACT_AFTER = 1024  # stale entries tolerated before the heaps are rebuilt


class PendingJobs:
    """The pending jobs of one queue, in heap order; call with the queue's lock held."""

    def __init__(self, order: Order, sizer: Callable[[Payload], int] | None) -> None:
        """``sizer``: what a payload counts against ``max_pending_bytes`` (None: unbounded,
        nothing is counted)."""
        self._order = order
        self._sizer = sizer
        self._delayed: list[tuple[float, int, int, str]] = []  # (due, level, seq, job id)
        self._ready: list[tuple[int, float, int, str]] = []  # (level, due, seq, job id)
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

    def head(self) -> tuple[float, int, int, str] | None:
        """The entry at the top of the delayed heap (stale or not), to tell a new head."""
        return self._delayed[0] if self._delayed else None

    def is_head(self, job: Job) -> bool:
        """Whether ``job`` (just pushed) is at the top of the delayed heap."""
        return bool(self._delayed) and self._delayed[0] == _delayed_entry(job)

    def push(self, job: Job) -> None:
        self._count(job, +1)
        heapq.heappush(self._delayed, _delayed_entry(job))

    def restore(self, jobs: Iterable[Job]) -> None:
        """Add many jobs at once (recovery): one heapify instead of a push each."""
        for job in jobs:
            self._count(job, +1)
            self._delayed.append(_delayed_entry(job))
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
                return self._live[self._delayed[0][3]]
            return None
        self._promote(now)
        if self._ready:
            return self._live[self._ready[0][3]]
        if early and self._delayed and self._delayed[0][0] <= now + early:
            return self._live[self._delayed[0][3]]
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
            return self._live[self._delayed[0][3]] if due else None
        self._promote(now)
        return self._live[self._ready[0][3]] if self._ready else None

    def _promote(self, now: float) -> None:
        """``order="priority"``: move the jobs due by ``now`` to the ready heap. Only jobs
        really due move there: a job in it is due for every taker, including one that must
        never get a job early (a worker on another clock)."""
        while self._delayed and self._delayed[0][0] <= now:
            entry = heapq.heappop(self._delayed)
            if self._stale_delayed(entry):
                self._stale -= 1
            else:
                heapq.heappush(self._ready, (entry[1], entry[0], entry[2], entry[3]))
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
        ready = _smallest(self._ready, n, self._stale_ready)
        delayed = _smallest(self._delayed, n - len(ready), self._stale_delayed)
        return [self._live[entry[3]] for entry in (*ready, *delayed)]

    def _taken(self, job_id: str) -> Job:
        """The job of an entry just popped from a top that _drop_stale_heads left live."""
        job = self._live[job_id]
        self._count(job, -1)
        return job

    def _discard(self, job: Job) -> None:
        job.cancelled = True
        self._stale += 1
        self._count(job, -1)
        self._drop_stale_heads()
        if self._stale > COMPACT_AFTER and self._stale > len(self._live):
            self._delayed = _live_entries(self._delayed, self._stale_delayed)
            self._ready = _live_entries(self._ready, self._stale_ready)
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

    def _stale_delayed(self, entry: tuple[float, int, int, str]) -> bool:
        job = self._live.get(entry[3])
        return job is None or job.seq != entry[2] or job.due != entry[0]

    def _stale_ready(self, entry: tuple[int, float, int, str]) -> bool:
        job = self._live.get(entry[3])
        return job is None or job.seq != entry[2] or job.due != entry[1]

    def _drop_stale_heads(self) -> None:
        while self._delayed and self._stale_delayed(self._delayed[0]):
            heapq.heappop(self._delayed)
            self._stale -= 1
        while self._ready and self._stale_ready(self._ready[0]):
            heapq.heappop(self._ready)
            self._stale -= 1


def _delayed_entry(job: Job) -> tuple[float, int, int, str]:
    return (job.due, job.priority, job.seq, job.job_id)


Entry = TypeVar("Entry", tuple[float, int, int, str], tuple[int, float, int, str])


def _live_entries(heap: Sequence[Entry], stale: Callable[[Entry], bool]) -> list[Entry]:
    """The live entries of ``heap``, one per job (a job moved to the same due time has
    two alike): what a rebuilt heap keeps, so that no stale entry outlives the count."""
    seen: set[str] = set()
    entries: list[Entry] = []
    for entry in heap:
        if not stale(entry) and entry[3] not in seen:
            seen.add(entry[3])
            entries.append(entry)
    return entries


def _smallest(heap: Sequence[Entry], n: int, stale: Callable[[Entry], bool]) -> list[Entry]:
    """The ``n`` smallest live entries of ``heap``, in order: a walk from the top that
    only ever looks at the children of what it took (a heap's k smallest). A job moved
    to the same due time has two live entries until one is popped: it counts once."""
    entries: list[Entry] = []
    seen: set[str] = set()
    frontier = [(heap[0], 0)] if heap and n > 0 else []
    while frontier and len(entries) < n:
        entry, index = heapq.heappop(frontier)
        if not stale(entry) and entry[3] not in seen:
            seen.add(entry[3])
            entries.append(entry)
        for child in (2 * index + 1, 2 * index + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))
    return entries
