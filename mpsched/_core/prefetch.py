"""Prefetched jobs: due jobs handed to a worker together with the one it takes, which the
queue may take back until that worker starts them.

A short job costs less to run than the round trip that fetches it, so a worker whose last
job was short asks for more than one (``JobQueue.take_batch``'s ``more``). What it gets
beyond the first stays *revocable* until the worker starts it, which keeps the order that
design.md promises (with N workers, jobs start in heap order; a due job never waits behind
a running one while a worker is free):

- only jobs already due, with no timeout and that the caller's predicate accepts, are
  prefetched, and only while no other taker waits for work;
- the worker starts a prefetched job only after *claiming* it (``Claims``: in the
  manager, a slot the worker process shares, under a lock); the queue *revokes* the jobs of
  a worker it has not started yet when
  - a taker finds nothing due (it takes them back and runs the first: stealing),
  - a job becomes due that goes before one of them (a retry, or a HIGH job with
    ``order="priority"``),
  - one of them is cancelled, or the worker leaves;
- revoked jobs go back to the heap as never received: no attempt is counted.

A revocation has three steps, so that no lock is held across a process boundary: under the
queue's lock, :meth:`Prefetched.begin_revoke_locked` marks the worker; without it,
``Claims.revoke`` moves the worker's slot past what it has started and says where it
stopped; under the lock again, :meth:`Prefetched.end_revoke_locked` gives back the jobs
from there on. While a worker is marked, no new batch is handed to it (its slot could be
reopened under the revocation's feet).

Pure, like the queue: no multiprocessing; the Claims of a test are plain Python.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from mpsched._core.admission import Admission
from mpsched._core.clock import Clock
from mpsched._core.job import Assignment, Job
from mpsched._core.leases import Leases
from mpsched._core.queues import PendingQueues, Queues
from mpsched._core.wall_offset import WallOffset

PREFETCH = 8  # jobs a worker asks for at once, at most (the first and up to 7 prefetched)
# A worker asks for as many jobs as its last one's run time says fit in this (at most
# PREFETCH): a job that ran this long or longer gets no company. Each take costs the
# manager a wake-up (~50-100 µs of CPU on the cores the jobs need, whatever it carries),
# so CPU-heavy jobs of a few ms come in batches too; past this, a take is a small part of
# a job and prefetching buys nothing.
BATCH_TIME = 0.016
# A prefetched job whose worker has not started it this long after its batch was handed
# out (the batch's own length, and some) is taken back by the next worker that takes, if
# it goes before what that worker would get: its own worker is held up (a job ran far
# longer than the last one), and heap order says it starts next. (An idle worker that
# finds nothing due takes it back at once.)
PREFETCH_HOLD = BATCH_TIME + 0.005


class Claims(Protocol):
    """Where the queue and the workers agree on which prefetched jobs have started.

    Lease ids grow with each job handed out, so "everything from lease ``cut`` on" names
    what a worker may no longer start.
    """

    def reopen(self, worker_id: str) -> bool:
        """A new batch is about to be handed to ``worker_id``: it may start every job of it.
        False if it cannot claim jobs at all (not a local worker): it gets none prefetched.
        Called with the queue's lock held, while the worker waits for the batch and no
        revocation of it is under way: it must not block."""

    def revoke(self, worker_id: str, lowest: int) -> int | None:
        """Stop ``worker_id`` from starting any prefetched job from lease ``lowest`` on that
        it has not started. Returns the first lease id it may no longer start (it started
        every one below), or None if it could not be told in time (nothing is revoked).
        Called without the queue's lock."""


class Prefetched:
    """For each worker, its prefetched jobs that it may not have started, in lease order.

    No lock of its own: JobQueue calls every method with its lock held.
    """

    def __init__(self) -> None:
        self._batches: dict[str, list[tuple[int, Job]]] = {}  # worker -> (lease id, job)
        self._handed: dict[str, float] = {}  # worker -> when its batch was handed out
        self._revoking: set[str] = set()  # workers between begin_ and end_revoke_locked

    def __bool__(self) -> bool:
        return bool(self._batches)

    def __contains__(self, worker_id: str) -> bool:
        return worker_id in self._batches

    def may_hand_locked(self, worker_id: str) -> bool:
        """Whether a batch with prefetched jobs may be handed to ``worker_id`` now."""
        return worker_id not in self._revoking

    def handed_locked(self, worker_id: str, entries: list[tuple[int, Job]], now: float) -> None:
        """``entries`` (lease id, job) were prefetched for ``worker_id`` at ``now``."""
        self._batches[worker_id] = entries
        self._handed[worker_id] = now

    def forget_locked(self, worker_id: str) -> None:
        """``worker_id`` is done with its batch (it takes again): each job of it was
        started, or refused to it because it was revoked. A revocation under way keeps the
        entries: it gives back those the worker was refused."""
        if worker_id not in self._revoking:
            self._drop(worker_id)

    def drop_locked(self, worker_id: str) -> None:
        """``worker_id`` is gone: its leases ended with it (a revocation under way finds
        none of them held)."""
        self._drop(worker_id)

    def started_locked(self, worker_id: str, lease_id: int) -> None:
        """``worker_id`` reported ``lease_id``: it started every job of its batch up to it."""
        entries = self._batches.get(worker_id)
        if entries is None or entries[0][0] > lease_id:
            return
        left = [entry for entry in entries if entry[0] > lease_id]
        if left:
            self._batches[worker_id] = left
        else:
            self._drop(worker_id)

    def holder_locked(self, job_id: str) -> str | None:
        """The worker holding ``job_id`` among its prefetched jobs, if one does."""
        for worker_id, entries in self._batches.items():
            if any(job.job_id == job_id for _, job in entries):
                return worker_id
        return None

    def first_handed_locked(self) -> float | None:
        """When the oldest batch still held was handed out (None: none is held)."""
        return min(self._handed.values(), default=None)

    def held_since_locked(self, cutoff: float) -> list[str]:
        """The workers whose batch was handed out by ``cutoff`` and is still held."""
        return [
            worker_id
            for worker_id, when in self._handed.items()
            if when <= cutoff and worker_id not in self._revoking
        ]

    def victim_locked(
        self,
        taker: str,
        head: Job | None,
        held_since: float,
        before: Callable[[Job, Job], bool],
        queues: Queues = None,
    ) -> str | None:
        """A worker other than ``taker`` whose prefetched jobs ``taker`` takes back before
        it takes ``head`` (the due job it would get; None: nothing is due): with nothing
        due, any; else one whose batch was handed out by ``held_since`` and whose first job
        goes before ``head``. The one holding the job handed out first (lowest lease id)."""
        best: tuple[int, str] | None = None
        for worker_id, entries in self._batches.items():
            if worker_id == taker or worker_id in self._revoking:
                continue
            if queues is not None and entries[0][1].queue not in queues:
                continue  # the taker may not run it: taking it back would help nobody
            if head is not None and (
                self._handed[worker_id] > held_since or not before(entries[0][1], head)
            ):
                continue
            candidate = (entries[0][0], worker_id)
            best = candidate if best is None or candidate < best else best
        return None if best is None else best[1]

    def overtaken_locked(self, job: Job, before: Callable[[Job, Job], bool]) -> list[str]:
        """The workers holding a prefetched job that ``job`` goes before; ``before(a, b)``
        tells whether due job ``a`` goes before due job ``b``."""
        return [
            worker_id
            for worker_id, entries in self._batches.items()
            if worker_id not in self._revoking and before(job, entries[-1][1])
        ]

    def begin_revoke_locked(self, worker_id: str) -> int | None:
        """Mark ``worker_id`` as being revoked; returns the lowest lease id to revoke from,
        or None when there is nothing to revoke (or a revocation is under way)."""
        entries = self._batches.get(worker_id)
        if not entries or worker_id in self._revoking:
            return None
        self._revoking.add(worker_id)
        return entries[0][0]

    def end_revoke_locked(self, worker_id: str, cut: int | None) -> list[tuple[int, Job]]:
        """End the revocation of ``worker_id``: the entries it may no longer start (lease
        ``cut`` on; none if ``cut`` is None). It started the others, so none stays."""
        self._revoking.discard(worker_id)
        entries = self._drop(worker_id)
        if cut is None:
            return []
        return [entry for entry in entries if entry[0] >= cut]

    def _drop(self, worker_id: str) -> list[tuple[int, Job]]:
        self._handed.pop(worker_id, None)
        return self._batches.pop(worker_id, [])


class Prefetcher:
    """A queue's prefetched jobs: handed out with a take, taken back when they must be.

    Shares its JobQueue's lock, like Leases: methods ending in ``_locked`` are called with
    it held, and a revocation lets go of it while the worker's slot changes (the three
    steps above). ``push`` and ``pop_due`` are the heap's moves (HandOut's: they signal
    takers and submitters); ``on_returned`` is told of each job a revocation put back in
    the heap (see JobQueue).
    """

    def __init__(
        self,
        lock: threading.Lock,
        clock: Clock,
        pending: PendingQueues,
        leases: Leases,
        wall: WallOffset,
        claims: Claims | None,
        admission: Admission,
        *,
        push: Callable[[Job], None],
        pop_due: Callable[[float, float, Queues], Job | None],
    ) -> None:
        self._lock = lock  # the queue's: guards every field below
        self._pending = pending
        self._admission = admission
        self._leases = leases
        self._wall = wall
        self._claims = claims
        self._push = push
        self._pop_due = pop_due
        self.on_returned: Callable[[Job], None] | None = None
        self._table = Prefetched()
        # A taker whose own prefetched jobs are being revoked waits here (through the
        # queue's wait) until that ends; notified (all: such waits are rare) at the end of
        # every revocation.
        self.revoke_done = clock.condition(lock)
        # Workers whose prefetched jobs a job that entered the heap goes before: revoked
        # by the thread that added them, once it has let go of the lock.
        self._to_revoke: set[str] = set()
        self.handed = 0  # jobs prefetched so far
        self.revoked = 0  # of those, taken back

    def __bool__(self) -> bool:
        return bool(self._table)

    # ------------------------------------------------------------------ the table

    def forget_locked(self, worker_id: str) -> None:
        self._table.forget_locked(worker_id)

    def drop_locked(self, worker_id: str) -> None:
        self._table.drop_locked(worker_id)

    def started_locked(self, worker_id: str, lease_id: int) -> None:
        if worker_id in self._table:
            self._table.started_locked(worker_id, lease_id)

    def revoking_locked(self, worker_id: str) -> bool:
        """Whether a revocation of ``worker_id``'s batch is under way: it must start
        nothing newer before the jobs it was refused are back in the heap (were it to die
        meanwhile, its slot would count those as received)."""
        return not self._table.may_hand_locked(worker_id)

    # ------------------------------------------------------------- handing out

    def hand_locked(
        self,
        worker_id: str,
        now: float,
        more: int,
        prefetchable: Callable[[Job], bool] | None,
        queues: Queues = None,
    ) -> list[Assignment]:
        """Hand ``worker_id`` up to ``more`` due jobs of its ``queues`` beyond the one it
        took, in heap order, stopping at the first that may not be prefetched (a job of a
        full limit is parked and passed over, as by a take)."""
        if (
            self._claims is None
            or not self._table.may_hand_locked(worker_id)
            or not self._claims.reopen(worker_id)
        ):
            return []
        batch: list[Assignment] = []
        entries: list[tuple[int, Job]] = []
        while len(batch) < more:
            only = self._pending.only  # the default queue's heap, while it is the only one
            heap = only if queues is None else None
            if heap is None:
                heap = self._pending.due_heap(now, queues)
            job = None if heap is None else heap.due_head(now)
            if (
                heap is None
                or job is None
                or job.timeout is not None
                or (prefetchable is not None and not prefetchable(job))
                or (job.at is not None and self._wall.early_locked(job, now))
            ):
                break
            # the heap it came from: with the one default queue, the plain take
            popped = self._pop_due(now, 0.0, None if only is not None else (job.queue,))
            assert popped is job
            if job.limit is not None and not self._admission.admit_locked(job, now):
                continue
            assignment = self._leases.grant_locked(job, worker_id, now)
            batch.append(assignment)
            entries.append((assignment.lease.lease_id, job))
        if entries:
            self._table.handed_locked(worker_id, entries, now)
            self.handed += len(entries)
        return batch

    # ------------------------------------------------------------- taking back

    def take_back_locked(self, taker: str, now: float, queues: Queues = None) -> bool:
        """Revoke another worker's prefetched jobs that ``taker`` (of ``queues``) should
        start before what the heap would give it (PREFETCH_HOLD, or nothing due); True if
        any went back."""
        victim = self._table.victim_locked(
            taker,
            self._pending.due_head(now, queues),
            now - PREFETCH_HOLD,
            self._pending.sorts_before,
            queues,
        )
        return victim is not None and self.revoke_locked(victim) > 0

    def cancel_locked(self, job_ids: list[str]) -> None:
        """Take back the prefetched jobs among ``job_ids`` (with their batches' rest), so
        that a cancel finds them pending."""
        if self._table:
            for job_id in job_ids:
                holder = self._table.holder_locked(job_id)
                if holder is not None:
                    self.revoke_locked(holder)

    def overtaken_locked(self, job: Job, now: float) -> None:
        """``job`` entered the heap: if it is due and goes before a prefetched job, that
        job's worker is to be revoked (by :meth:`revoke_called_for`, after the lock)."""
        if self._table and job.due <= now:
            self._to_revoke.update(self._table.overtaken_locked(job, self._pending.sorts_before))

    def revoke_called_for_locked(self) -> None:
        """Run the revocations that jobs entering the heap called for."""
        while self._to_revoke:
            self.revoke_locked(self._to_revoke.pop())

    def revoke_called_for(self) -> None:
        """:meth:`revoke_called_for_locked`, from a caller that does not hold the lock."""
        if not self._to_revoke:
            return  # read without the lock: whoever adds one runs it after its own update
        with self._lock:
            self.revoke_called_for_locked()

    def revoke_locked(self, worker_id: str) -> int:
        """Put back in the heap the prefetched jobs ``worker_id`` has not started, as never
        received; returns how many. Lets go of the lock while the worker's slot changes."""
        lowest = self._table.begin_revoke_locked(worker_id)
        if lowest is None:
            return 0
        assert self._claims is not None  # nothing is prefetched without
        cut: int | None = None
        self._lock.release()
        try:
            cut = self._claims.revoke(worker_id, lowest)
        finally:
            self._lock.acquire()
            entries = self._table.end_revoke_locked(worker_id, cut)
            self.revoke_done.notify_all()
        returned = 0
        for lease_id, job in entries:
            if self._leases.drop_locked(lease_id) is None:
                continue  # its worker was released meanwhile: resolved there
            job.attempt -= 1
            self._push(job)
            if self.on_returned is not None:
                self.on_returned(job)  # before a taker can get it: we hold the lock
            returned += 1
        self.revoked += returned
        return returned
