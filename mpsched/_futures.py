"""The futures of one client and the thread that resolves them.

``JobFuture`` is the ``concurrent.futures.Future`` of one job. ``ClientCore`` keeps a
client's futures by job id, owns its write-behind outbox, and runs the result thread that
collects outcomes from the manager in batches and resolves them. It is kept apart from
the ``Client`` object so that the thread never holds a Client (or Scheduler) alive:
dropping the last reference lets its finalizer stop the manager.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from mpsched import _shm
from mpsched._errors import (
    MpschedError,
    ResultUnpicklingError,
    SchedulerShutdownError,
    StoreError,
)
from mpsched._job import CANCELLED, JobRequest, Outcome, Payload
from mpsched._outbox import Outbox
from mpsched._payload import loads, remote_exception
from mpsched._protocol import LONG_POLL, ClientHello, ServiceProxy
from mpsched._segment_pool import SegmentPool
from mpsched._transport import describe_versions

log = logging.getLogger("mpsched.client")

T = TypeVar("T")

MAP_BATCH = 256  # jobs per manager call in map()
DISCONNECTED = (EOFError, OSError)  # the manager is gone; OSError covers ConnectionError


class JobFuture(Future[T]):
    """A ``concurrent.futures.Future`` for one job; ``cancel()`` removes it from the heap.

    ``cancel()`` succeeds while the job is pending in the manager's heap (or not yet sent
    to it) and returns False once a worker has taken it. A cancelled future wakes
    ``concurrent.futures.wait()`` and ``as_completed()`` as the stdlib executors' futures
    do. ``running()`` stays False: the manager does not report starts, only outcomes.
    """

    def __init__(self, client: ClientCore, job_id: str, *, watched: bool = False) -> None:
        super().__init__()
        self._client = client
        # The id without job_id's wait: what mpsched's own bookkeeping keys by.
        self._job_id = job_id
        self.watched = watched  # a job this client did not submit (Client.job(job_id))
        # The reusable segment (mpsched._segment_pool) its job holds until it ends; "" once
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
        self._client.sent(self._job_id)
        return self._job_id

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        if not self._client.cancel_job(self._job_id):
            return False
        return _settle_cancelled(self)


def _settle_cancelled(future: Future[Any]) -> bool:
    """Cancel a future whose job was taken back, and tell everyone waiting on it.

    ``Future.cancel()`` wakes ``result()`` but not ``wait()``/``as_completed()``: those
    hear of a cancellation only from ``set_running_or_notify_cancel()``, which the stdlib
    executors call when they meet a cancelled work item. The caller must be the one that
    took the future out of ``ClientCore._futures``: no other path settles it then, and
    that call may be made only once.
    """
    if not Future.cancel(future):  # already finished: a failure settled it first
        return False
    future.set_running_or_notify_cancel()
    return True


class ClientCore:
    """Futures of one client and the thread that resolves them.

    Kept apart from the Scheduler object so the result thread never holds the Scheduler
    alive: dropping the last reference to a Scheduler lets its finalizer stop the manager.
    """

    def __init__(self, service: ServiceProxy) -> None:
        self.service = service
        self.client_id = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        # Guards _futures and closed. Submitters, cancel() and the result thread take it
        # briefly; nobody waits on it across a call to the manager.
        self._lock = threading.Lock()
        self._futures: dict[str, JobFuture[Any]] = {}
        self.closed = False
        self.exiting = False  # closed by the interpreter's exit: said when a submit is refused
        python, cp = describe_versions()
        max_pending = service.open_client(ClientHello(self.client_id, python, cp))
        options = service.payload_options()
        # The manager's segment prefix when this process maps its shared memory, else "".
        self.shm_prefix = _shm.shared_with(options)
        # Where this client's jobs put their large buffers (None: inline).
        self.pool = SegmentPool(self.shm_prefix, self.client_id) if self.shm_prefix else None
        self.max_pending_bytes = options.max_pending_bytes
        self.batch_size = min(MAP_BATCH, max_pending or MAP_BATCH)
        # A bounded queue must report QueueFullError at the call site: send synchronously.
        bounded = max_pending is not None or options.max_pending_bytes is not None
        self.outbox = None if bounded else Outbox(service, self._unsent, self.release)
        self._thread = threading.Thread(target=self._collect_loop, daemon=True,
                                        name=f"mpsched-results-{self.client_id}")
        self._thread.start()

    def new_future(self, payload: Payload = b"") -> JobFuture[Any]:
        """Register a future for a new job id, whose job carries ``payload``; raises once
        the client is closed."""
        future: JobFuture[Any] = JobFuture(self, f"{self.client_id}-{next(self._ids)}")
        if self.pool is not None:
            future.segment = self.pool.pooled(payload)
        with self._lock:  # held briefly: the result thread takes it per outcome
            if self.closed:
                why = " (the interpreter is exiting)" if self.exiting else ""
                raise SchedulerShutdownError(f"cannot schedule new futures after shutdown{why}")
            self._futures[future._job_id] = future
        return future

    def sent(self, job_id: str, timeout: float = 30.0) -> None:
        """Return once a job of this client has reached the manager (or failed to)."""
        if self.outbox is not None:
            self.outbox.wait_sent(job_id, timeout)

    def watch(self, job_id: str) -> JobFuture[Any]:
        """A future for any job the manager knows (this client's own, another's, or one
        from before a restart): done already if the job has ended, else the manager sends
        its outcome here too.

        Raises:
            JobNotFoundError: the manager knows no such job.
            SchedulerShutdownError: the client is closed.
        """
        with self._lock:
            if self.closed:
                raise SchedulerShutdownError("this client is shut down")
            existing = self._futures.get(job_id)
            if existing is not None:
                return existing
            future: JobFuture[Any] = JobFuture(self, job_id, watched=True)
            self._futures[job_id] = future
        try:
            outcome = self.service.watch(self.client_id, job_id)
        except BaseException:
            self.forget(job_id)
            raise
        if outcome is not None:  # it has ended: resolved before the caller sees it
            self._resolve(outcome)
        return future

    def leave_not_due(self, why: str) -> int:
        """Stop waiting for this client's jobs not yet due (a store keeps them for the next
        manager): their futures fail with SchedulerShutdownError. Returns how many."""
        if self.outbox is not None:
            self.outbox.flush()
        with contextlib.suppress(*DISCONNECTED):
            job_ids = self.service.not_due(self.client_id)
            with self._lock:
                futures = [self._futures.pop(j) for j in job_ids if j in self._futures]
            for future in futures:
                if future.set_running_or_notify_cancel():
                    future.set_exception(SchedulerShutdownError(f"job {future._job_id} {why}"))
            return len(futures)
        return 0

    def fail_watched(self, error: MpschedError) -> None:
        """Fail the futures of jobs this client only watches (it will not wait for them)."""
        with self._lock:
            watched = [f for f in self._futures.values() if f.watched]
            for future in watched:
                del self._futures[future._job_id]
        for future in watched:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def forget(self, job_id: str) -> bool:
        """Drop a job's future from those the result thread resolves; True if it was
        there, which makes the caller the one that settles it."""
        with self._lock:
            return self._futures.pop(job_id, None) is not None

    def outstanding(self) -> list[JobFuture[Any]]:
        with self._lock:
            return list(self._futures.values())

    def _unsent(self, requests: list[JobRequest], error: BaseException) -> None:
        # A batch the manager refused: its store could not take it (the manager carries
        # on, so does this client: those futures fail with the store's error), or the
        # manager is gone or stopping (the client closes).
        failure: BaseException = error
        with self._lock:
            if not isinstance(error, StoreError):
                self.closed = True
                failure = SchedulerShutdownError(
                    f"the job could not be sent to the manager: {error!r}")
            futures = [self._futures.pop(r.job_id) for r in requests if r.job_id in self._futures]
        self.release(requests)
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(failure)

    def cancel_job(self, job_id: str) -> bool:
        """Take a job back from the outbox or the heap. True if it will never run and
        the caller now owns its future (it left ``_futures``: settle it)."""
        if self.outbox is not None and self.outbox.withdraw(job_id):
            return self.forget(job_id)
        try:
            removed = self.service.cancel(job_id, self.client_id)
        except DISCONNECTED:
            return False
        if removed:
            self.ended([job_id])
        return removed and self.forget(job_id)

    def cancel_jobs(self, job_ids: list[str]) -> int:
        """Cancel several jobs with one manager call at most; returns how many were
        cancelled (the others had started, or finished)."""
        withdrawn: list[str] = []
        rest: list[str] = []
        for job_id in job_ids:
            unsent = self.outbox is not None and self.outbox.withdraw(job_id)
            (withdrawn if unsent else rest).append(job_id)
        removed: list[str] = []
        if rest:
            with contextlib.suppress(*DISCONNECTED):
                removed = self.service.cancel_many(rest)
        self.ended(removed)
        return self._settle(withdrawn + removed)

    def cancel_pending(self, *, not_due_only: bool = False) -> int:
        """Cancel every job of this client not yet taken (shutdown(cancel_futures)); with
        ``not_due_only``, after sending what is unsent, only those whose due time is still
        ahead (interpreter exit). Returns how many were cancelled."""
        cancelled = 0
        if self.outbox is not None:
            if not not_due_only:
                cancelled += self._settle(self.outbox.withdraw_all())  # waiters hear at once
            self.outbox.flush()  # a batch on its way must land before we cancel the rest
        with contextlib.suppress(*DISCONNECTED):
            removed = self.service.cancel_client(self.client_id, not_due_only)
            self.ended(removed)
            cancelled += self._settle(removed)
        return cancelled

    def release(self, requests: list[JobRequest]) -> None:
        """Unlink the segments of jobs the manager never took (refused, withdrawn, or
        never sent): this client still owns them."""
        for request in requests:
            segment = _shm.segment_of(request.payload)
            if segment and self.pool is not None:
                self.pool.discard(segment)
            elif segment:
                _shm.unlink(segment)

    def ended(self, job_ids: list[str]) -> None:
        """These jobs of this client ended in the manager (cancelled there, or not queued
        because another job held their key) before their futures were settled: the
        segments they held are free again."""
        if self.pool is None or not job_ids:
            return
        with self._lock:
            futures = [f for j in job_ids if (f := self._futures.get(j)) is not None]
            segments = [f.segment for f in futures if f.segment]
            for future in futures:
                future.segment = ""
        for segment in segments:
            self.pool.returned(segment)

    def _settle(self, cancelled_ids: list[str]) -> int:
        with self._lock:
            futures = [self._futures.pop(j) for j in cancelled_ids if j in self._futures]
        for future in futures:
            _settle_cancelled(future)
        return len(cancelled_ids)

    def _collect_loop(self) -> None:
        # However this thread ends, every outstanding future fails and the client closes:
        # nobody else would ever resolve them.
        error: MpschedError
        try:
            while (outcomes := self.service.collect(self.client_id,
                                                    self._trim_pool())) is not None:
                for outcome in outcomes:
                    self._resolve(outcome)
            error = SchedulerShutdownError("the mpsched manager stopped")
        except DISCONNECTED:
            error = SchedulerShutdownError("the mpsched manager went away")
        except BaseException as exc:
            log.error("the result thread of client %s failed: %r", self.client_id, exc)
            error = SchedulerShutdownError(f"this client's result thread failed: {exc!r}")
            error.__cause__ = exc
        with self._lock:
            self.closed = True
        if self.outbox is not None:
            self.outbox.withdraw_all()  # their futures fail below; the jobs must not run
        if self.pool is not None:
            self.pool.close()
        self._fail_all(error)

    def _trim_pool(self) -> float:
        """Unlink the segments that stayed free too long; returns how long the next
        collect may wait (the result thread is the one that trims them on time)."""
        return LONG_POLL if self.pool is None else min(LONG_POLL, self.pool.trim())

    def _resolve(self, outcome: Outcome) -> None:
        with self._lock:
            future = self._futures.pop(outcome.job_id, None)
            segment = "" if future is None else future.segment
        if future is None:
            return
        if segment and self.pool is not None:  # the job has ended: its segment is free
            self.pool.returned(segment)
        if outcome.error_kind == CANCELLED:  # by another client, or through a job id
            _settle_cancelled(future)
            return
        if not future.set_running_or_notify_cancel():
            return
        if outcome.ok:
            try:
                future.set_result(loads(outcome.payload))
            except BaseException as exc:
                future.set_exception(ResultUnpicklingError(
                    f"job {outcome.job_id}: the result could not be unpickled here: {exc!r}"))
            return
        future.set_exception(remote_exception(outcome))

    def _fail_all(self, error: MpschedError) -> None:
        with self._lock:
            futures = list(self._futures.values())
            self._futures.clear()
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is unsent, close this client's mailbox, wait for the result thread."""
        if self.outbox is not None:
            self.outbox.close(timeout)
        with contextlib.suppress(*DISCONNECTED):
            self.service.close_client(self.client_id)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class MapResults(Iterator[T]):
    """map()'s results in input order; closing it early cancels the jobs not yet started."""

    def __init__(self, futures: list[JobFuture[T]], deadline: float | None) -> None:
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
            left[0]._client.cancel_jobs([f._job_id for f in left])

    def __del__(self) -> None:
        self.close()
