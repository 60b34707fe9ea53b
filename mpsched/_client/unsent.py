"""UnsentBatches: what becomes of a batch of jobs the outbox could not send.

The manager may refuse a batch: its store could not take it (the manager carries on, so
does the client: those futures fail with the store's error), or it is stopping (the client
closes). Or the connection was lost, and the batch may or may not have reached the manager:
one with a store tells after the outage (until then the futures wait); else they fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mpsched._client.future_table import FutureTable
from mpsched._client.link import DISCONNECTED, ManagerLink
from mpsched._client.store_failures import StoreFailures
from mpsched._core.job import JobRequest
from mpsched._errors import SchedulerShutdownError, StoreError, StoreUnavailableError

log = logging.getLogger("mpsched.client")


class UnsentBatches:
    """Holds in doubt, or fails, the batches of one client the outbox could not send."""

    def __init__(
        self,
        client_id: str,
        link: ManagerLink,
        futures: FutureTable,
        release: Callable[[list[JobRequest]], None],
    ) -> None:
        """``futures``: the client's table; ``release``: unlinks the segments of jobs the
        manager never took."""
        self._link = link
        self._futures = futures
        self._release = release
        # One line when the manager's store starts failing this client's batches, and
        # one when it stops: never a line per batch.
        self.store_failures = StoreFailures(client_id)

    def refused(self, requests: list[JobRequest], error: BaseException) -> None:
        """The outbox could not send ``requests``: ``error`` says why."""
        failure: BaseException = error
        if isinstance(error, DISCONNECTED) and not isinstance(error, StoreError):
            failure = self._link.lost(
                error,
                self._link.service,
                "the job may have reached the "
                "manager (and may run) or not: without a store nothing "
                "tells which",
            )
            if self._futures.hold_in_doubt(requests):
                log.info(
                    "a batch of %d job(s) lost its connection on its way; the "
                    "manager is asked about it once it is back",
                    len(requests),
                )
                return
        if isinstance(error, StoreUnavailableError):
            self.store_failures.failed(len(requests), error)
        else:
            log.error("could not send %d job(s) to the manager: %r", len(requests), error)
        stopping = not isinstance(error, DISCONNECTED)  # StoreError is one
        if stopping:
            failure = SchedulerShutdownError(f"the job could not be sent to the manager: {error!r}")
        futures = self._futures.pop_many([r.job_id for r in requests], close=stopping)
        self._release(requests)
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(failure)
