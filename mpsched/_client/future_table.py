"""FutureTable: the futures one client waits for, by job id, and whether it takes new ones.

A submit registers its job's future here before the job is sent; the result thread takes
out each future whose outcome comes and resolves it; a cancel, a failed send or a lost
manager takes futures out to settle them. Whoever takes a future out owns it: no other
path settles it then (mpsched._client.job_future.settle_cancelled).

The table also says whether the client is closed (shut down by its owner, or its result
thread ended) or has lost its manager (mpsched._client.link): either refuses new futures,
with the error the link gives. And it keeps the batches whose submit lost its connection
to a manager with a store, in doubt until the manager is back.
"""

from __future__ import annotations

import threading
from typing import Any

from mpsched._client.job_future import JobFuture
from mpsched._client.link import ManagerLink
from mpsched._core.job import JobRequest
from mpsched._errors import ManagerConnectionLostError, MpschedError, SchedulerShutdownError


class FutureTable:
    """The futures of one client, whose manager is reached through ``link``."""

    def __init__(self, link: ManagerLink) -> None:
        self._link = link
        # Guards _futures, closed, exiting and _in_doubt. Submitters, cancels and the result
        # thread take it briefly; nobody waits on it, or holds it across a manager call.
        self._lock = threading.Lock()
        self._futures: dict[str, JobFuture[Any]] = {}
        self.closed = False  # no new future: the owner shut the client, or it closed itself
        self.exiting = False  # closed by the interpreter's exit: said when a submit is refused
        # Batches whose submit lost its connection, to a manager with a store: sent again
        # after the outage if the manager then does not know them.
        self._in_doubt: list[JobRequest] = []

    # ------------------------------------------------------------- open or closed

    def shut(self, *, exiting: bool = False) -> bool:
        """Close for the client's owner (``exiting``: the interpreter's exit); True if it
        was open until now. The link reconnects no more."""
        with self._lock:
            was_open = not self.closed
            self.closed = True
            self.exiting = self.exiting or (exiting and was_open)
            self._link.close()
        return was_open

    def close(self, gone: ManagerConnectionLostError | None = None) -> None:
        """Close for good (the result thread ended); with ``gone``, the manager was lost
        and every later call raises it, unless the client was closed already. Batches in
        doubt are dropped: their futures are failed by the caller."""
        with self._lock:
            if gone is not None and not self.closed:
                self._link.give_up(gone)
            self.closed = True
            self._in_doubt = []

    def refusal(self, shut_down: str) -> MpschedError:
        """The error of a call this client cannot make (closed, or its manager lost);
        ``shut_down`` is the message after a shutdown."""
        with self._lock:
            return self._refusal_locked(shut_down)

    def _refusal_locked(self, shut_down: str) -> MpschedError:
        refusal = None if self.closed and self._link.gone is None else self._link.refusal()
        return refusal or SchedulerShutdownError(shut_down)

    # ------------------------------------------------------------------ putting in

    def add(self, future: JobFuture[Any]) -> None:
        """Keep ``future`` under its job id.

        Raises:
            SchedulerShutdownError, ManagerConnectionLostError: the client is closed, or
                its manager lost.
        """
        with self._lock:  # held briefly: the result thread takes it per outcome
            if self.closed or self._link.outage is not None:
                why = " (the interpreter is exiting)" if self.exiting else ""
                raise self._refusal_locked(f"cannot schedule new futures after shutdown{why}")
            self._futures[future.id_nowait] = future

    def watch(self, future: JobFuture[Any]) -> JobFuture[Any]:
        """Keep ``future`` (of a job to watch) unless one is kept for its job id already;
        returns the one kept: if it is ``future``, the caller tells the manager.

        Raises:
            SchedulerShutdownError, ManagerConnectionLostError: as :meth:`add`.
        """
        with self._lock:
            if self.closed or self._link.outage is not None:
                raise self._refusal_locked("this client is shut down")
            return self._futures.setdefault(future.id_nowait, future)

    def hold_in_doubt(self, requests: list[JobRequest]) -> bool:
        """Keep a batch whose submit lost its connection, if the manager will tell after the
        outage whether it got it (it has a store, and the client reconnects); True if so."""
        with self._lock:
            if self._link.durable and self._link.reconnects and not self.closed:
                self._in_doubt.extend(requests)
                return True
            return False

    def take_in_doubt(self) -> list[JobRequest]:
        """The batches in doubt (see :meth:`hold_in_doubt`), handed over."""
        with self._lock:
            in_doubt, self._in_doubt = self._in_doubt, []
        return in_doubt

    # ----------------------------------------------------------------- taking out

    def get(self, job_id: str) -> JobFuture[Any] | None:
        """The future kept for ``job_id``, left in."""
        with self._lock:
            return self._futures.get(job_id)

    def pop(self, job_id: str) -> JobFuture[Any] | None:
        """Take out the future of ``job_id`` (the caller settles it); None if not kept."""
        with self._lock:
            return self._futures.pop(job_id, None)

    def pop_many(self, job_ids: list[str], *, close: bool = False) -> list[JobFuture[Any]]:
        """Take out the futures of those of ``job_ids`` kept; with ``close``, the client
        takes no new future from then on."""
        with self._lock:
            if close:
                self.closed = True
            return [self._futures.pop(j) for j in job_ids if j in self._futures]

    def pop_watched(self) -> list[JobFuture[Any]]:
        """Take out the futures of jobs this client only watches."""
        with self._lock:
            watched = [f for f in self._futures.values() if f.watched]
            for future in watched:
                del self._futures[future.id_nowait]
        return watched

    def pop_all(self) -> list[JobFuture[Any]]:
        """Take out every future."""
        with self._lock:
            futures = list(self._futures.values())
            self._futures.clear()
        return futures

    def free_segments(self, job_ids: list[str]) -> list[str]:
        """The reusable segments the futures of ``job_ids`` held (their jobs ended), now
        held by none of them."""
        with self._lock:
            futures = [f for j in job_ids if (f := self._futures.get(j)) is not None]
            segments = [f.segment for f in futures if f.segment]
            for future in futures:
                future.segment = ""
        return segments

    def __len__(self) -> int:
        """How many futures are kept (their jobs' outcomes still to come)."""
        return len(self._futures)  # one read of a dict's size: no lock needed

    def futures(self) -> list[JobFuture[Any]]:
        """Every future kept, left in."""
        with self._lock:
            return list(self._futures.values())

    def job_ids(self) -> list[str]:
        """The ids of the jobs of every future kept."""
        with self._lock:
            return list(self._futures)
