"""PendingQueues: one heap per named queue, and the jobs parked behind a full limit.

A taker serves a list of queues in order (None: every queue). It gets the due job of the
first queue in its list that has one; one that serves every queue gets the first due job
of all the heaps' heads, in the manager's order. With the one queue every job names by
default, every call goes straight to that heap.

A due job whose limit is full leaves its queue's heap for its limit's *parked* heap (same
order), and goes back when a slot frees or a rate window opens (mpsched._core.limits): no
taker ever looks past it. A parked job is still pending: counted, listed, cancellable.

No lock of its own: JobQueue (mpsched._core.queue) owns one instance, and it and its parts
call every method with its lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from mpsched._core.heap import PendingJobs
from mpsched._core.job import DEFAULT_QUEUE, Job, Order, Payload, Priority

Queues = tuple[str, ...] | None  # a taker's subscriptions in order; None: every queue


class PendingQueues:
    """The pending jobs of every queue, and those parked behind a limit."""

    def __init__(self, order: Order, sizer: Callable[[Payload], int] | None) -> None:
        self._order = order
        self._sizer = sizer
        default = PendingJobs(order, sizer)
        self._queues: dict[str, PendingJobs] = {DEFAULT_QUEUE: default}
        self._parked: dict[str, PendingJobs] = {}  # by limit name
        # Every heap above, for lookups; and the only one while no other exists.
        self._all: list[PendingJobs] = [default]
        self._single: PendingJobs | None = default

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        if self._single is not None:
            return len(self._single)
        return sum(len(heap) for heap in self._all)

    def __bool__(self) -> bool:
        if self._single is not None:
            return bool(len(self._single))
        return any(len(heap) for heap in self._all)

    def __contains__(self, job_id: str) -> bool:
        if self._single is not None:
            return job_id in self._single
        return any(job_id in heap for heap in self._all)

    def __iter__(self) -> Iterator[Job]:
        jobs: list[Job] = []
        for heap in self._all:
            jobs.extend(heap)
        return iter(jobs)

    def get(self, job_id: str) -> Job | None:
        for heap in self._all:
            job = heap.get(job_id)
            if job is not None:
                return job
        return None

    @property
    def only(self) -> PendingJobs | None:
        """The default queue's heap while it is the only one (every call goes straight
        to it); None once another queue or a limit's parked jobs exist."""
        return self._single

    @property
    def levels(self) -> dict[int, int]:
        """Live jobs per priority level, parked ones included."""
        if self._single is not None:
            return self._single.levels
        levels = dict.fromkeys((p.level for p in Priority), 0)
        for heap in self._all:
            for level, count in heap.levels.items():
                levels[level] += count
        return levels

    @property
    def bytes(self) -> int:
        """What live payloads count against max_pending_bytes."""
        return sum(heap.bytes for heap in self._all)

    def by_queue(self) -> dict[str, int]:
        """Pending jobs per queue, parked ones counted in their queue."""
        counts = {name: len(heap) for name, heap in self._queues.items()}
        for heap in self._parked.values():
            for job in heap:
                counts[job.queue] = counts.get(job.queue, 0) + 1
        return counts

    def parked_limit(self, job_id: str) -> str | None:
        """The limit a pending job waits for, if it is parked."""
        for name, heap in self._parked.items():
            if job_id in heap:
                return name
        return None

    def parked_count(self, limit: str) -> int:
        heap = self._parked.get(limit)
        return 0 if heap is None else len(heap)

    def parked_limits(self) -> list[str]:
        """The limits with parked jobs."""
        return [name for name, heap in self._parked.items() if len(heap)]

    # ------------------------------------------------------------------ moves

    def _queue(self, name: str) -> PendingJobs:
        heap = self._queues.get(name)
        if heap is None:
            heap = self._queues[name] = PendingJobs(self._order, self._sizer)
            self._all.append(heap)
            self._single = None
        return heap

    def push(self, job: Job) -> None:
        heap = self._queues.get(job.queue)
        (self._queue(job.queue) if heap is None else heap).push(job)

    def restore(self, jobs: Iterable[Job]) -> None:
        """Add many jobs at once (recovery): one heapify per queue."""
        by_queue: dict[str, list[Job]] = {}
        for job in jobs:
            by_queue.setdefault(job.queue, []).append(job)
        for name, queued in by_queue.items():
            self._queue(name).restore(queued)

    def remove(self, job_id: str) -> Job | None:
        """Take a live job out (cancel), wherever it waits."""
        for heap in self._all:
            job = heap.remove(job_id)
            if job is not None:
                return job
        return None

    def heads(self) -> tuple[object, ...]:
        """Each queue's head entry, to tell whether one changed (compared by value)."""
        if self._single is not None:
            return (self._single.head(),)
        return tuple(heap.head() for heap in self._queues.values())

    def is_head(self, job: Job) -> bool:
        """Whether ``job`` (just pushed) is its queue's head."""
        return self._queues[job.queue].is_head(job)

    def park(self, job: Job) -> None:
        """``job`` (just popped) waits for a slot of its limit."""
        assert job.limit is not None
        heap = self._parked.get(job.limit)
        if heap is None:
            heap = self._parked[job.limit] = PendingJobs(self._order, self._sizer)
            self._all.append(heap)
            self._single = None
        heap.push(job)

    def unpark(self, limit: str, count: int) -> list[Job]:
        """Up to ``count`` parked jobs of ``limit``, first first, out of their heap (the
        caller pushes them back in their queue)."""
        heap = self._parked.get(limit)
        jobs: list[Job] = []
        while heap is not None and len(jobs) < count:
            job = heap.pop_first()
            if job is None:
                break
            jobs.append(job)
        return jobs

    # ------------------------------------------------------------------ takes

    def _served(self, queues: Queues) -> Iterable[PendingJobs]:
        if queues is None:
            return self._queues.values()
        return [heap for name in queues if (heap := self._queues.get(name)) is not None]

    def head_due(self, queues: Queues = None) -> float | None:
        """When the earliest pending job of ``queues`` is due (None: none pending)."""
        if self._single is not None and queues is None:
            return self._single.head_due()
        dues = [due for heap in self._served(queues) if (due := heap.head_due()) is not None]
        return min(dues, default=None)

    def has_ready(self) -> bool:
        return any(heap.has_ready() for heap in self._queues.values())

    def serves_any(self, queues: Queues) -> bool:
        """Whether a taker of ``queues`` has pending jobs (due or not) to wait for."""
        if queues is None:
            return any(len(heap) for heap in self._queues.values())
        return any(len(heap) for heap in self._served(queues))

    def due_heap(self, now: float, queues: Queues, early: float = 0.0) -> PendingJobs | None:
        """The heap a taker of ``queues`` gets its next job from: the first of its queues
        with a due job, or (every queue) the one whose due job goes first."""
        if queues is not None:
            for name in queues:
                heap = self._queues.get(name)
                if heap is not None and heap.peek_due(now, early) is not None:
                    return heap
            return None
        if self._single is not None:
            return self._single if self._single.peek_due(now, early) is not None else None
        by_time = self._order is Order.TIME
        best: PendingJobs | None = None
        best_key: tuple[float | int, ...] | None = None
        for heap in self._queues.values():
            job = heap.peek_due(now, early)
            if job is not None:
                key = (
                    (job.due, job.priority, job.seq)
                    if by_time
                    else (job.priority, job.due, job.seq)
                )
                if best_key is None or key < best_key:
                    best, best_key = heap, key
        return best

    def pop_due(self, now: float, early: float = 0.0, queues: Queues = None) -> Job | None:
        """The next job for a taker of ``queues``, ``early`` seconds ahead, out of its heap."""
        if self._single is not None and queues is None:
            return self._single.pop_due(now, early)
        if queues is not None and len(queues) == 1:
            heap = self._queues.get(queues[0])
        else:
            heap = self.due_heap(now, queues, early)
        return None if heap is None else heap.pop_due(now, early)

    def due_head(self, now: float, queues: Queues = None) -> Job | None:
        """The job :meth:`pop_due` would return now with no ``early``, left in place."""
        if self._single is not None and queues is None:
            return self._single.due_head(now)
        heap = self.due_heap(now, queues)
        return None if heap is None else heap.due_head(now)

    def key(self, job: Job) -> tuple[float | int, ...]:
        """Where ``job`` goes among due jobs (the manager's order): lower goes first."""
        return job.time_key() if self._order is Order.TIME else job.priority_key()

    def sorts_before(self, a: Job, b: Job) -> bool:
        """Whether ``a`` goes before ``b`` when both are due."""
        return self.key(a) < self.key(b)

    def first(self, n: int) -> list[Job]:
        """Up to ``n`` pending jobs in the order takers would get them (every queue's,
        then the parked ones)."""
        if self._single is not None:
            return self._single.first(n)
        jobs: list[Job] = []
        for heap in self._queues.values():
            jobs.extend(heap.first(n))
        jobs.sort(key=self.key)
        jobs = jobs[:n]
        for heap in self._parked.values():
            jobs.extend(heap.first(n - len(jobs)))
        return jobs
