"""Cancels: taking a client's jobs back, and letting go of those it will not wait for.

A job not yet sent is withdrawn from the outbox (mpsched._client.outbox); one pending in the
manager's heap is removed there. Whoever takes a future out of the client's table settles
it (mpsched._client.future_table): a cancelled job's future is cancelled, and one the client
stops waiting for fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from mpsched._client.future_table import FutureTable
from mpsched._client.job_future import settle_cancelled
from mpsched._client.link import DISCONNECTED, ManagerLink
from mpsched._client.outbox import Outbox
from mpsched._errors import ManagerConnectionLostError, SchedulerShutdownError


class Cancels:
    """Takes one client's jobs back, from its outbox or the manager's heap, and settles them."""

    def __init__(
        self,
        client_id: str,
        link: ManagerLink,
        futures: FutureTable,
        outbox: Outbox | None,
        ended: Callable[[list[str]], None],
    ) -> None:
        """``futures``: the client's table; ``ended``: told of the jobs that ended in the
        manager before their futures were settled (their segments are free again)."""
        self._client_id = client_id
        self._link = link
        self._futures = futures
        self._outbox = outbox
        self._ended = ended

    def cancel_job(self, job_id: str) -> bool:
        """Take a job back from the outbox or the heap. True if it will never run and
        the caller now owns its future (it left the table: settle it)."""
        if self._outbox is not None and self._outbox.withdraw(job_id):
            return self._futures.pop(job_id) is not None
        try:
            removed = self._link.ask(lambda service: service.cancel(job_id, self._client_id))
        except ManagerConnectionLostError:
            return False
        if removed:
            self._ended([job_id])
        return removed and self._futures.pop(job_id) is not None

    def cancel_jobs(self, job_ids: list[str]) -> int:
        """Cancel several jobs with one manager call at most; returns how many were
        cancelled (the others had started, or finished)."""
        withdrawn: list[str] = []
        rest: list[str] = []
        for job_id in job_ids:
            unsent = self._outbox is not None and self._outbox.withdraw(job_id)
            (withdrawn if unsent else rest).append(job_id)
        removed: list[str] = []
        if rest:
            with contextlib.suppress(*DISCONNECTED):
                removed = self._link.service.cancel_many(rest)
        self._ended(removed)
        return self._settle(withdrawn + removed)

    def cancel_pending(self, *, not_due_only: bool = False) -> int:
        """Cancel every job of this client not yet taken (shutdown(cancel_futures)); with
        ``not_due_only``, after sending what is unsent, only those whose due time is still
        ahead (interpreter exit). Returns how many were cancelled."""
        cancelled = 0
        if self._outbox is not None:
            if not not_due_only:
                cancelled += self._settle(self._outbox.withdraw_all())  # waiters hear at once
            self._outbox.flush()  # a batch on its way must land before we cancel the rest
        with contextlib.suppress(*DISCONNECTED):
            removed = self._link.service.cancel_client(self._client_id, not_due_only)
            self._ended(removed)
            cancelled += self._settle(removed)
        return cancelled

    def leave_not_due(self, why: str) -> int:
        """Stop waiting for this client's jobs not yet due (a store keeps them for the next
        manager): their futures fail with SchedulerShutdownError. Returns how many."""
        if self._outbox is not None:
            self._outbox.flush()
        with contextlib.suppress(*DISCONNECTED):
            job_ids = self._link.service.not_due(self._client_id)
            futures = self._futures.pop_many(job_ids)
            for future in futures:
                if future.set_running_or_notify_cancel():
                    future.set_exception(SchedulerShutdownError(f"job {future.id_nowait} {why}"))
            return len(futures)
        return 0

    def _settle(self, cancelled_ids: list[str]) -> int:
        """Cancel the futures of jobs taken back; returns how many jobs were."""
        for future in self._futures.pop_many(cancelled_ids):
            settle_cancelled(future)
        return len(cancelled_ids)
