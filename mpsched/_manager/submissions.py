"""Submissions: the submit and cancel path of the manager.

A client's batch is checked, its shared-memory segments noted, then journalled and queued
(mpsched._manager.journal), all or none; a batch that waits for its parents goes to the
workflows. Cancels take pending jobs out of the heap, or out of the workflows, and tell
their clients (mpsched._manager.endings). A requeue puts an ended job back by its id.
"""

from __future__ import annotations

import logging

from mpsched._core.job import DEFAULT_QUEUE, After, Job, PayloadOptions
from mpsched._core.queue_like import JobQueueLike
from mpsched._manager.endings import Endings
from mpsched._manager.journal import BaseJournal
from mpsched._manager.shared_journal import SharedJournal
from mpsched._manager.workflows import Workflows, check_after
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import JobRequestWire, request_from_wire
from mpsched._protocol.records import LONG_POLL

log = logging.getLogger("mpsched.manager")


class Submissions:
    """Jobs into the queue (submit, submit_after, requeue) and out of it (the cancels)."""

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        segments: Segments,
        endings: Endings,
        workflows: Workflows | None,
    ) -> None:
        """``workflows``: the jobs waiting for their parents; None with a shared store."""
        self._queue = queue
        self._journal = journal
        self._segments = segments
        self._endings = endings
        self._workflows = workflows

    def submit(
        self, requests: list[JobRequestWire], timeout: float | None, withdrawn: int = 0
    ) -> list[str] | None:
        """Journal and queue a batch of jobs, all or none: see ManagerService.submit."""
        bounded = LONG_POLL if timeout is None else min(timeout, LONG_POLL)
        batch = [request_from_wire(r) for r in requests]
        routed = [r for r in batch if r.limit is not None or r.queue != DEFAULT_QUEUE]
        if routed:  # before the store: a refused batch leaves no trace
            self._queue.check_routes(routed)
        self._segments.submitted(batch)  # before a worker can take and end one
        try:
            holders = self._journal.submit(batch, bounded)
        except BaseException:
            self._segments.refused(batch)
            raise
        if holders is not None:  # jobs not queued: another job holds their key
            self._segments.ended(
                r.job_id for r, h in zip(batch, holders, strict=True) if h != r.job_id
            )
        if withdrawn:
            self._queue.count_withdrawn(withdrawn)
        return holders

    def submit_after(self, requests: list[JobRequestWire], afters: list[After]) -> None:
        """Journal and queue jobs that wait for their parents, all or none: see
        ManagerService.submit_after."""
        batch = [request_from_wire(r) for r in requests]
        afters = [After._make(a) for a in afters]
        for request, after in zip(batch, afters, strict=True):
            check_after(request, after)
        self._segments.submitted(batch)
        try:
            if self._workflows is not None:
                self._workflows.submit(batch, afters)
            else:
                assert isinstance(self._journal, SharedJournal)
                self._journal.submit_after(batch, afters)
        except BaseException:
            self._segments.refused(batch)
            raise

    def payload_options(self) -> PayloadOptions:
        """How clients send payloads: see ManagerService.payload_options."""
        return self._segments.options(self._queue.max_pending_bytes, self._journal.max_payload)

    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        """Cancel a pending job; False if it is not pending (see ManagerService.cancel)."""
        owner = self._journal.owner(job_id) if client_id is not None else None
        jobs = self._queue.cancel_jobs([job_id]) or self._cancel_waiting([job_id])
        if not jobs:
            return False
        tell_owner = owner is not None and owner != client_id
        self._endings.cancelled(jobs, {job_id: {owner}} if owner and tell_owner else None)
        return True

    def requeue(self, client_id: str, job_id: str) -> None:
        """Put a failed or cancelled job back in the queue: see ManagerService.requeue."""
        self._journal.requeue_ended(client_id, job_id)
        log.info("job %s requeued by client %s", job_id, client_id)

    def cancel_many(self, job_ids: list[str]) -> list[str]:
        """Cancel pending jobs; returns the ids of those that were pending."""
        jobs = self._queue.cancel_jobs(job_ids)
        if self._workflows is not None and len(self._workflows) and len(jobs) < len(job_ids):
            jobs += self._cancel_waiting(job_ids)
        return self._endings.cancelled(jobs)

    def _cancel_waiting(self, job_ids: list[str]) -> list[Job]:
        """Take out the jobs among ``job_ids`` that wait for their parents."""
        if self._workflows is None:
            return []
        jobs = self._workflows.cancel(job_ids)
        if jobs:
            self._queue.count_withdrawn(len(jobs))
        return jobs

    def not_due(self, client_id: str) -> list[str]:
        """The client's pending jobs not yet due."""
        waiting = (
            []
            if self._workflows is None or not len(self._workflows)
            else [job.job_id for job, _n in self._workflows.listing() if job.client_id == client_id]
        )
        return self._queue.not_due(client_id) + waiting

    def cancel_client(self, client_id: str, not_due_only: bool = False) -> list[str]:
        """Cancel a client's pending jobs (only those not yet due: ``not_due_only``)."""
        jobs = self._queue.cancel_client_jobs(client_id, not_due_only=not_due_only)
        if self._workflows is not None and len(self._workflows):
            waiting = self._workflows.cancel_client(client_id)
            self._queue.count_withdrawn(len(waiting))
            jobs += waiting
        return self._endings.cancelled(jobs)
