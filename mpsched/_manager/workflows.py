"""Workflows: jobs that run after others, in the manager of a queue in memory (with or
without a SQLite store).

A job with parents (``after=``, ``ResultOf``) never enters the heap while it waits: it sits
in a DependencyGraph (mpsched._core.dependencies) with a count of parents not ended. Every
end of a job (its report, its loss, its cancel) comes here after it is journalled; a job
with no children costs one look at two fields. The last parent's end releases a child into
the heap at its own due time, with the parents' outcomes its ``ResultOf`` take in front of
its payload (bytes as the workers reported them: nothing is unpickled here). A parent that
failed or was cancelled fails its children with DependencyFailedError, unless they allow
failure, and their ends count their own children down in turn.

With a store, the edges are journalled with the job; a manager started again rebuilds the
counts from the parents' states (:meth:`Workflows.recover`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from mpsched._core.dependencies import DependencyGraph, Failed, Released
from mpsched._core.job import After, Job, JobRequest, JobState, Outcome, OutcomeKind
from mpsched._core.queue import JobQueue
from mpsched._core.result_of import attach_inputs
from mpsched._errors import DependencyFailedError, InvalidJobError, JobNotFoundError
from mpsched._manager.journal import BaseJournal, cancelled, decode, failure
from mpsched._payload import frames, shm

# A parent the manager does not know may be one that is ending: out of the queue, its end
# not yet journalled (without a store, nothing holds it for that moment). A submit waits
# this long for the ends under way before it calls the parent unknown.
UNKNOWN_WAIT = 1.0

log = logging.getLogger("mpsched.manager")

# How the ends of jobs reach clients: (client id, outcome, other watchers).
Deliver = Callable[[str, Outcome, set[str]], None]


def check_after(request: JobRequest, after: After) -> None:
    """Check a job's parents as the client may get them wrong.

    Raises:
        InvalidJobError: no parent, a parent that is not a non-empty string, the job
            itself among them, or a ``key`` (a keyed job cannot have parents).
    """
    if not after.parents:
        raise InvalidJobError("after= names no job")
    for parent in after.parents:
        if not isinstance(parent, str) or not parent:
            raise InvalidJobError(f"a parent is a JobFuture or a job id, not {parent!r}")
    if request.job_id in after.parents:
        raise InvalidJobError(f"job {request.job_id} cannot run after itself")
    if request.key is not None:
        raise InvalidJobError("a job with parents (after=, ResultOf) cannot have a key")


class Workflows:
    """The jobs of one queue that wait for parents, and the ends that release them."""

    def __init__(self, queue: JobQueue, journal: BaseJournal) -> None:
        self._queue = queue
        self._journal = journal
        # Guards the graph. Held by a submit of jobs with parents from its look at their
        # parents' states until the jobs are in the graph (and journalled), and by each
        # end's count-down until the children it let go are in the heap or journalled
        # failed, so that no parent ends unseen and a job is always found somewhere.
        # Taken before the queue's lock and the journal's, never after. A submit whose
        # parent is unknown waits on _counted, below, which lets it go.
        self._lock = threading.Lock()
        self._graph = DependencyGraph()
        # Submits under way (written under the lock): while one is, every end is looked
        # at, since the graph may be about to hold children of the job that ends.
        self._adding = 0
        # Over the graph's lock: a submit that found a parent unknown waits here for the
        # next end to be counted down (_ended_all notifies it), then looks again.
        self._counted = threading.Condition(self._lock)
        self.deliver: Deliver | None = None  # set by the service, which delivers ends

    # ------------------------------------------------------------------ submit

    def submit(self, requests: list[JobRequest], afters: list[After]) -> None:
        """Journal jobs with parents and put each in the graph; a job whose parents have
        all ended already is released (or failed) at once.

        Raises:
            InvalidJobError: as :func:`check_after`, or a repeated job id.
            JobNotFoundError: a parent the manager does not know; nothing was queued.
            StoreError: the store could not take them; nothing was queued.
        """
        for request, after in zip(requests, afters, strict=True):
            check_after(request, after)
        seqs = self._queue.reserve_seqs(len(requests))
        with self._lock:
            self._adding += 1
            try:
                states = self._all_parents_locked(requests, afters)
                jobs = [self._job(r, seq) for r, seq in zip(requests, seqs, strict=True)]
                self._journal.waiting(jobs, requests, afters)
                self._queue.count_submitted(len(jobs))
                verdicts = [
                    verdict
                    for job, after, (live, ended) in zip(jobs, afters, states, strict=True)
                    if (verdict := self._graph.add(job, after, live, ended))
                ]
                failed = self._settle_locked(verdicts)
            finally:
                self._adding -= 1
        self._ended_all(self._deliver(failed))

    def _all_parents_locked(
        self, requests: list[JobRequest], afters: list[After]
    ) -> list[tuple[list[str], dict[str, Outcome]]]:
        """Each job's parents not ended and those ended (``_parents_locked``). A parent
        that is unknown may be ending: wait for the ends under way, up to UNKNOWN_WAIT,
        letting the lock go meanwhile, then look at every parent again.

        Raises:
            JobNotFoundError: a parent still unknown after UNKNOWN_WAIT.
        """
        known = {r.job_id for r in requests}
        deadline: float | None = None
        while True:
            try:
                return [self._parents_locked(after, known) for after in afters]
            except JobNotFoundError:
                now = time.monotonic()
                deadline = now + UNKNOWN_WAIT if deadline is None else deadline
                if now >= deadline:
                    raise
                self._counted.wait(deadline - now)  # ends count down meanwhile

    def _parents_locked(
        self, after: After, batch: set[str]
    ) -> tuple[list[str], dict[str, Outcome]]:
        """A job's parents not ended (waiting, pending, running, or in ``batch``), and
        those ended, with their outcomes.

        Raises:
            JobNotFoundError: one the manager does not know.
        """
        live: list[str] = []
        ended: dict[str, Outcome] = {}
        for parent in after.parents:
            if parent in batch or parent in self._graph or self._queue.find(parent):
                live.append(parent)
                continue
            record = self._journal.get(parent, fresh=True)
            if record is None:
                raise JobNotFoundError(parent)
            if not record.state.finished:
                live.append(parent)  # it ends in a moment: its end is journalled first
            elif record.state is JobState.CANCELLED:
                ended[parent] = cancelled(parent)
            elif record.outcome is not None:
                ended[parent] = decode(record.outcome)
            else:
                ended[parent] = self._journal.outcome_of(parent)
        return live, ended

    def _job(self, request: JobRequest, seq: int) -> Job:
        return Job(
            job_id=request.job_id,
            client_id=request.client_id,
            payload=request.payload,
            priority=request.priority,
            due=self._queue.due_of(request),
            seq=seq,
            timeout=request.timeout,
            retries=request.retries,
            key=None,
            name=request.name,
            at=request.at,
            retry=request.retry,
            queue=request.queue,
            limit=request.limit,
        )

    # ------------------------------------------------------------------ ends

    def ended(self, job_id: str, outcome: Outcome) -> None:
        """A job ended (journalled already): count its children down."""
        if not self._graph and not self._adding:
            return
        self._ended_all([(job_id, outcome)])

    def _ended_all(self, ends: list[tuple[str, Outcome]]) -> None:
        while ends:
            with self._lock:
                verdicts: list[Released | Failed] = []
                for job_id, outcome in ends:
                    if outcome.ok and self._graph.wants_result(job_id):
                        outcome = _inline(outcome)
                    verdicts += self._graph.ended(job_id, outcome)
                failed = self._settle_locked(verdicts)
                self._counted.notify_all()  # a submit may wait for this end
            ends = self._deliver(failed)

    def _settle_locked(self, verdicts: list[Released | Failed]) -> list[_Failure]:
        """Release what the graph let go, into the heap; journal the failures (so that a
        job is always found somewhere: waiting, queued or ended). Returns the failures,
        to deliver once the lock is let go."""
        released = [v.job for v in verdicts if isinstance(v, Released)]
        for verdict in verdicts:
            if isinstance(verdict, Released) and verdict.inputs:
                verdict.job.payload = attach_inputs(verdict.job.payload, verdict.inputs)
        if released:
            self._queue.release(released)
        failures: list[_Failure] = []
        for verdict in verdicts:
            if isinstance(verdict, Failed):
                job = verdict.job
                error = DependencyFailedError(job.job_id, verdict.parent_id, verdict.parent_outcome)
                outcome = failure(job.job_id, error, OutcomeKind.DEPENDENCY_FAILED)
                self._queue.fail(job, crashed=False)
                watchers = self._journal.finished(job, outcome)
                log.info("%s", error)
                failures.append(_Failure(job, outcome, watchers or set()))
        return failures

    def _deliver(self, failures: list[_Failure]) -> list[tuple[str, Outcome]]:
        """Tell the failed jobs' clients; returns their ends, to count down in turn."""
        for failed in failures:
            if self.deliver is not None:
                self.deliver(failed.job.client_id, failed.outcome, failed.watchers)
        return [(failed.job.job_id, failed.outcome) for failed in failures]

    # ------------------------------------------------------------------ lookups, cancel

    def cancel(self, job_ids: Iterable[str]) -> list[Job]:
        """Take the waiting jobs among ``job_ids`` out (their parents are left alone)."""
        if not len(self._graph):
            return []
        with self._lock:
            return [job for job_id in job_ids if (job := self._graph.remove(job_id))]

    def cancel_client(self, client_id: str) -> list[Job]:
        """Take out every waiting job of one client."""
        with self._lock:
            mine = [w.job.job_id for w in self._graph if w.job.client_id == client_id]
            return [job for job_id in mine if (job := self._graph.remove(job_id))]

    # find() and listing() take no lock: the journal asks them with its own lock held,
    # which a submit here takes with this one held. A dict's get and its copy are atomic
    # under the GIL; a count read meanwhile may be one off, as any listing may be.

    def find(self, job_id: str) -> tuple[Job, int] | None:
        """A waiting job and how many parents it waits for; None if it does not wait."""
        waiting = self._graph.get(job_id)
        return None if waiting is None else (waiting.job, waiting.remaining)

    def listing(self) -> list[tuple[Job, int]]:
        """Every waiting job, with how many parents it waits for."""
        return [(w.job, w.remaining) for w in self._graph]

    def remaining(self, job_id: str) -> int:
        """How many parents a job waits for (0: none, or it does not wait)."""
        return self._graph.remaining(job_id)

    def __len__(self) -> int:
        return len(self._graph)

    def waiting_levels(self) -> dict[int, int]:
        """How many jobs wait for their parents, by priority level."""
        return dict(self._graph.levels)

    # ------------------------------------------------------------------ recovery

    def recover(self, waiting: list[tuple[Job, After]]) -> None:
        """Put back jobs a store kept waiting for parents (before any worker takes a job):
        each parent pending, running or waiting too is waited for again; one that ended
        counts as ended, with its outcome."""
        if not waiting:
            return
        ids = {job.job_id for job, _after in waiting}
        verdicts: list[Released | Failed] = []
        with self._lock:
            for job, after in waiting:
                live: list[str] = []
                ended: dict[str, Outcome] = {}
                for parent in after.parents:
                    if parent in ids or self._queue.find(parent):
                        live.append(parent)
                    else:
                        ended[parent] = self._journal.outcome_of(parent)
                verdict = self._graph.add(job, after, live, ended)
                if verdict is not None:
                    verdicts.append(verdict)
            failed = self._settle_locked(verdicts)
        self._ended_all(self._deliver(failed))
        log.info("recovered %d job(s) waiting for their parents", len(self._graph))


class _Failure(NamedTuple):
    """A waiting job failed because of a parent: journalled, to be delivered."""

    job: Job
    outcome: Outcome
    watchers: set[str]


def _inline(outcome: Outcome) -> Outcome:
    """An outcome whose large buffers are in a shared-memory segment, with them inline: a
    child reads it after the parent's client took the segment over."""
    parsed = frames.parse(outcome.payload)
    if parsed is None or not parsed.segment:
        return outcome
    try:
        return outcome._replace(payload=shm.inline(outcome.payload))
    except OSError as exc:
        error = DependencyFailedError(
            outcome.job_id, outcome.job_id, f"its result could not be read: {exc}"
        )
        return failure(outcome.job_id, error, OutcomeKind.OUTCOME_LOST)
