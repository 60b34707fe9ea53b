"""Watches: futures for jobs a client names by id, which the manager is asked about.

``Client.job(job_id)`` watches any job the manager knows; ``Client.requeue(job_id)`` puts
a failed or cancelled one back in the queue. Either way the future is kept in the client's
table (mpsched._client.future_table) before the manager is asked, so no outcome comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from mpsched._client.future_table import FutureTable
from mpsched._client.job_future import FutureOwner, JobFuture
from mpsched._client.link import DISCONNECTED, ManagerLink
from mpsched._core.job import Outcome
from mpsched._errors import InvalidJobError, StoreError
from mpsched._protocol.proxy import ServiceProxy

T = TypeVar("T")


class Watches:
    """Asks the manager for the outcomes of jobs named by id: watched, or requeued."""

    def __init__(
        self,
        owner: FutureOwner,
        client_id: str,
        link: ManagerLink,
        futures: FutureTable,
        resolve: Callable[[Outcome], None],
    ) -> None:
        """``owner``: the client the futures belong to; ``futures``: its table;
        ``resolve``: resolves a future with an outcome the manager has already."""
        self._owner = owner
        self._client_id = client_id
        self._link = link
        self._futures = futures
        self._resolve = resolve

    def watch(self, job_id: str) -> JobFuture[Any]:
        """A future for any job the manager knows (this client's own, another's, or one
        from before a restart): done already if the job has ended, else the manager sends
        its outcome here too.

        Raises:
            JobNotFoundError: the manager knows no such job.
            SchedulerShutdownError: the client is closed.
            ManagerConnectionLostError: the manager is unreachable.
        """
        future: JobFuture[Any] = JobFuture(self._owner, job_id, watched=True)
        kept = self._futures.watch(future)
        if kept is not future:
            return kept
        outcome = self._ask_for(job_id, lambda service: service.watch(self._client_id, job_id))
        if outcome is not None:  # it has ended: resolved before the caller sees it
            self._resolve(outcome)
        return future

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """Put a failed or cancelled job back in the queue by id (Client.requeue); its
        end comes to this client, to the future returned, registered before the manager
        is asked so that no end can come first.

        Raises:
            InvalidJobError: this client waits for the job already (it is pending or
                running), or the manager refused (see ManagerService.requeue).
            JobNotFoundError, SchedulerShutdownError, ManagerConnectionLostError.
        """
        future: JobFuture[Any] = JobFuture(self._owner, job_id)
        if self._futures.watch(future) is not future:
            raise InvalidJobError(
                f"job {job_id} cannot be requeued: it is pending or "
                f"running (only a failed or cancelled job can be)"
            )
        self._ask_for(job_id, lambda service: service.requeue(self._client_id, job_id))
        return future

    def _ask_for(self, job_id: str, call: Callable[[ServiceProxy], T]) -> T:
        """``call`` the manager for a future of ``job_id`` just registered; on any error
        the future is forgotten, and a lost connection raised as the link says."""
        service = self._link.service
        try:
            return call(service)
        except DISCONNECTED as exc:
            self._futures.pop(job_id)
            if isinstance(exc, StoreError):
                raise
            raise self._link.lost(exc, service) from exc
        except BaseException:
            self._futures.pop(job_id)
            raise
