"""The future of one job, and map()'s iterator of results.

A ``JobFuture`` belongs to the client that made it (mpsched._client.core.ClientCore, seen
here as a :class:`FutureOwner`): reading its id, or cancelling it, asks that client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class FutureOwner(Protocol):
    """What a future asks of the client that made it."""

    def wait_sent(self, job_id: str, timeout: float = ...) -> None:
        """Return once the job has reached the manager (or failed to)."""

    def cancel_job(self, job_id: str) -> bool:
        """Take the job back; True if it will never run (the caller settles the future)."""

    def cancel_jobs(self, job_ids: list[str]) -> int:
        """Cancel several jobs with one manager call at most."""


class JobFuture(Future[T]):
    """A ``concurrent.futures.Future`` for one job; ``cancel()`` removes it from the heap.

    ``cancel()`` succeeds while the job is pending in the manager's heap (or not yet sent
    to it) and returns False once a worker has taken it. A cancelled future wakes
    ``concurrent.futures.wait()`` and ``as_completed()`` as the stdlib executors' futures
    do. ``running()`` stays False: the manager does not report starts, only outcomes.
    """

    def __init__(self, client: FutureOwner, job_id: str, *, watched: bool = False) -> None:
        super().__init__()
        self._client = client
        # The job's id without job_id's wait for the manager to know it: what the client's
        # own bookkeeping keys by.
        self.id_nowait = job_id
        self.watched = watched  # a job this client did not submit (Client.job(job_id))
        # The reusable segment (mpsched._payload.segment_pool) its job holds until it ends; "" once
        # handed back, or for none.
        self.segment = ""

    @property
    def job_id(self) -> str:
        """The job's id (the manager's name for it, printed by ``submit``).

        By the time it is read, the manager knows the job: a job still waiting in the
        client's write-behind outbox is sent first (one round trip at most, for every job
        submitted before it too). So an id handed to another process can be looked up there
        at once (``Client.job(job_id)``); submitting without reading ids costs nothing. (A
        job cancelled before it was sent, or before its id was read, never reached the
        manager: its id is unknown there.)
        """
        self._client.wait_sent(self.id_nowait)
        return self.id_nowait

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        if not self._client.cancel_job(self.id_nowait):
            return False
        return settle_cancelled(self)


def settle_cancelled(future: Future[Any]) -> bool:
    """Cancel a future whose job was taken back, and tell everyone waiting on it.

    ``Future.cancel()`` wakes ``result()`` but not ``wait()``/``as_completed()``: those
    hear of a cancellation only from ``set_running_or_notify_cancel()``, which the stdlib
    executors call when they meet a cancelled work item. The caller must be the one that
    took the future out of its client's futures (mpsched._client.future_table): no other path
    settles it then, and that call may be made only once.
    """
    if not Future.cancel(future):  # already finished: a failure settled it first
        return False
    future.set_running_or_notify_cancel()
    return True


class MapResults(Iterator[T]):
    """map()'s results in input order; closing it early cancels the jobs not yet started."""

    def __init__(
        self, client: FutureOwner, futures: list[JobFuture[T]], deadline: float | None
    ) -> None:
        """``client``: the one that made ``futures``."""
        self._client = client
        self._futures = futures[::-1]  # pop() from the end gives input order
        self._deadline = deadline

    def __next__(self) -> T:
        if not self._futures:
            raise StopIteration
        future = self._futures.pop()
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        try:
            return future.result(remaining)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancel the jobs not yet started, in one manager call (this also runs when the
        iterator is dropped, so it must not cost a call per item)."""
        left = [f for f in self._futures if not f.done()]
        self._futures.clear()
        if left:
            self._client.cancel_jobs([f.id_nowait for f in left])

    def __del__(self) -> None:
        self.close()
