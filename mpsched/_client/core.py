"""The futures of one client and the thread that resolves them.

``JobFuture`` (mpsched._client.job_future) is the ``concurrent.futures.Future`` of one job.
``ClientCore`` keeps a client's futures by job id (in a FutureTable,
mpsched._client.future_table, which also says whether the client takes new jobs), owns its
write-behind outbox and its link to the manager (mpsched._client.link), and runs the
result thread, which collects
outcomes from the manager in batches (mpsched._client.results) and resolves them. It is
kept apart from the ``Client`` object so that the thread never holds a Client (or
Scheduler) alive: dropping the last reference lets its finalizer stop the manager.

Its other roles are named helpers it owns: ``Cancels`` takes jobs back
(mpsched._client.cancels), ``Watches`` asks for jobs named by id (mpsched._client.watches),
and ``UnsentBatches`` deals with the batches the outbox could not send
(mpsched._client.unsent).

When the connection to the manager is lost, a client that can reconnect (a client of
``mpsched.connect()``) rides the outage out in its result thread (mpsched._client.outage), and
carries on under the same client id once a manager answers at the address again. A client
that cannot (a Scheduler's, whose manager nothing restarts) closes, its futures failed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from mpsched._client.cancels import Cancels
from mpsched._client.future_table import FutureTable
from mpsched._client.job_future import JobFuture, settle_cancelled
from mpsched._client.link import DISCONNECTED, ManagerLink
from mpsched._client.outbox import Outbox
from mpsched._client.results import serve_outcomes
from mpsched._client.unsent import UnsentBatches
from mpsched._client.watches import Watches
from mpsched._core.job import JobRequest, Outcome, OutcomeKind, Payload
from mpsched._errors import (
    ManagerConnectionLostError,
    MpschedError,
    PayloadTooLargeError,
    ResultUnpicklingError,
    SchedulerShutdownError,
)
from mpsched._payload import frames, shm
from mpsched._payload.pickling import loads, remote_exception
from mpsched._payload.segment_pool import SegmentPool
from mpsched._protocol.proxy import (
    ServiceProxy,
)
from mpsched._protocol.records import ClientHello
from mpsched._transport.sockets import describe_versions
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.client")

MAP_BATCH = 256  # jobs per manager call in map()


class ClientCore:
    """Futures of one client and the thread that resolves them.

    Kept apart from the Scheduler object so the result thread never holds the Scheduler
    alive: dropping the last reference to a Scheduler lets its finalizer stop the manager.
    """

    def __init__(
        self,
        service: ServiceProxy,
        *,
        reconnect: Callable[[], ServiceProxy] | None = None,
        lost_advice: str = "",
    ) -> None:
        """``reconnect``: connects to the manager's address again (None: this client closes
        when it loses its manager); ``lost_advice``: what the error of a client that
        cannot reconnect tells its caller to do."""
        self.client_id = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        python, cloudpickle = describe_versions()
        hello = ClientHello(client_id=self.client_id, python=python, cloudpickle=cloudpickle)
        max_pending = service.open_client(hello)
        options = service.payload_options()
        # The manager's segment prefix when this process maps its shared memory, else "".
        self.shm_prefix = shm.shared_with(options)
        # Where this client's jobs put their large buffers (None: inline).
        self.pool = SegmentPool(self.shm_prefix, self.client_id) if self.shm_prefix else None
        # Segment names are that manager's alone: such a client cannot move to another.
        self.link = ManagerLink(
            service,
            hello,
            reconnect if self.pool is None else None,
            lost_advice,
            on_outage=self._pause_outbox,
        )
        self._futures = FutureTable(self.link)  # the futures this client waits for
        self.max_pending_bytes = options.max_pending_bytes
        self.max_payload = options.max_payload  # None: the manager sets no bound
        self.batch_size = min(MAP_BATCH, max_pending or MAP_BATCH)
        # A bounded queue must report QueueFullError at the call site: send synchronously.
        bounded = max_pending is not None or options.max_pending_bytes is not None
        unsent = UnsentBatches(self.client_id, self.link, self._futures, self.release)
        self.outbox = (
            None
            if bounded
            else Outbox(service, unsent.refused, self.release, on_sent=unsent.store_failures.sent)
        )
        self._cancels = Cancels(self.client_id, self.link, self._futures, self.outbox, self.ended)
        self._watches = Watches(self, self.client_id, self.link, self._futures, self.resolve)
        self._thread = self._start_result_thread(service)

    def _start_result_thread(self, service: ServiceProxy) -> threading.Thread:
        """Open the result thread's connection, then start the thread. Opened here, as the
        outbox opens its sender's, so that a manager that stalls once the client is made
        holds the client's calls until it goes on, and fails none of its jobs (see
        ServiceProxy.open_connection); a manager that cannot be reached now fails the
        making of the client, before it has jobs."""
        name = f"mpsched-results-{self.client_id}"
        try:
            connection = service.open_connection(name)
        except BaseException:
            if self.outbox is not None:
                self.outbox.close()  # its sender thread ends
            raise
        thread = threading.Thread(
            target=self._collect_loop, args=(connection,), daemon=True, name=name
        )
        thread.start()
        return thread

    def _pause_outbox(self) -> None:
        """The manager is lost: the outbox takes and sends nothing until it is back."""
        if self.outbox is not None:
            self.outbox.pause()

    @property
    def service(self) -> ServiceProxy:
        """The proxy of the manager (another one after a reconnect)."""
        return self.link.service

    @property
    def closed(self) -> bool:
        """The client takes no new job: its owner shut it, or it closed itself."""
        return self._futures.closed

    def shut(self, *, exiting: bool = False) -> bool:
        """Close this client for its owner (shutdown, detach, ``exiting``: the interpreter's
        exit, said when a submit is refused); True if it was open until now."""
        return self._futures.shut(exiting=exiting)

    def future(self, job_id: str) -> JobFuture[Any] | None:
        """The future this client keeps for a job, if it still waits for it."""
        return self._futures.get(job_id)

    def refuse(self, job_id: str) -> MpschedError:
        """Forget the future of a job the paused outbox did not take; returns the error
        its submit raises."""
        self.forget(job_id)
        return self._futures.refusal("cannot schedule new futures after shutdown")

    def new_future(self, payload: Payload = b"") -> JobFuture[Any]:
        """Register a future for a new job id, whose job carries ``payload``; raises once
        the client is closed."""
        future: JobFuture[Any] = JobFuture(self, f"{self.client_id}-{next(self._ids)}")
        if self.pool is not None:
            future.segment = self.pool.pooled(payload)
        self._futures.add(future)
        return future

    def wait_sent(self, job_id: str, timeout: float = 30.0) -> None:
        """Return once a job of this client has reached the manager (or failed to)."""
        if self.outbox is not None:
            self.outbox.wait_sent(job_id, timeout)

    def watch(self, job_id: str) -> JobFuture[Any]:
        """A future for any job the manager knows; see :meth:`Watches.watch`."""
        return self._watches.watch(job_id)

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """Put a failed or cancelled job back in the queue; see :meth:`Watches.requeue`."""
        return self._watches.requeue(job_id)

    def cancel_job(self, job_id: str) -> bool:
        """Take a job back; True if the caller now settles its future (see Cancels)."""
        return self._cancels.cancel_job(job_id)

    def cancel_jobs(self, job_ids: list[str]) -> int:
        """Cancel several jobs with one manager call at most; returns how many were."""
        return self._cancels.cancel_jobs(job_ids)

    def cancel_pending(self, *, not_due_only: bool = False) -> int:
        """Cancel every job of this client not yet taken; see :meth:`Cancels.cancel_pending`."""
        return self._cancels.cancel_pending(not_due_only=not_due_only)

    def leave_not_due(self, why: str) -> int:
        """Stop waiting for this client's jobs not yet due; see :meth:`Cancels.leave_not_due`."""
        return self._cancels.leave_not_due(why)

    def fail_watched(self, error: MpschedError) -> None:
        """Fail the futures of jobs this client only watches (it will not wait for them)."""
        for future in self._futures.pop_watched():
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def forget(self, job_id: str) -> bool:
        """Drop a job's future from those the result thread resolves; True if it was
        there, which makes the caller the one that settles it."""
        return self._futures.pop(job_id) is not None

    def outstanding(self) -> list[JobFuture[Any]]:
        """The futures this client still waits for, left in."""
        return self._futures.futures()

    def waiting(self) -> int:
        """How many outcomes this client still waits for (its unresolved futures)."""
        return len(self._futures)

    def check_payload(self, payload: Payload) -> None:
        """Refuse, at the call site, a job pickle larger than the store takes (with the
        buffers it has in shared memory: the store holds them inline).

        Raises:
            PayloadTooLargeError: it is; its shared-memory segment (if any) is released.
        """
        if self.max_payload is None:
            return
        size = shm.payload_size(payload)
        if size > self.max_payload:
            self._release_payload(payload)
            raise PayloadTooLargeError(size, self.max_payload, "the job store")

    def release(self, requests: list[JobRequest]) -> None:
        """Unlink the segments of jobs the manager never took (refused, withdrawn, or
        never sent): this client still owns them."""
        for request in requests:
            self._release_payload(request.payload)

    def _release_payload(self, payload: Payload) -> None:
        segment = frames.segment_of(payload)
        if segment and self.pool is not None:
            self.pool.discard(segment)
        elif segment:
            shm.unlink(segment)

    def ended(self, job_ids: list[str]) -> None:
        """These jobs of this client ended in the manager (cancelled there, or not queued
        because another job held their key) before their futures were settled: the
        segments they held are free again."""
        if self.pool is None or not job_ids:
            return
        for segment in self._futures.free_segments(job_ids):
            self.pool.returned(segment)

    def _collect_loop(self, connection: FastConnection) -> None:
        """The result thread: resolve outcomes until it ends, then close the client."""
        self.link.service.use_connection(connection)
        # However this thread ends, every outstanding future fails and the client closes:
        # nobody else would ever resolve them.
        error: MpschedError
        try:
            error = serve_outcomes(self)
        except BaseException as exc:
            log.error("the result thread of client %s failed: %r", self.client_id, exc)
            error = SchedulerShutdownError(f"this client's result thread failed: {exc!r}")
            error.__cause__ = exc
        # A lost manager's error is what each later call raises; batches in doubt are
        # dropped, their futures fail below.
        self._futures.close(error if isinstance(error, ManagerConnectionLostError) else None)
        self.link.close()
        if self.outbox is not None:
            self.outbox.withdraw_all()  # their futures fail below; the jobs must not run
        if self.pool is not None:
            self.pool.close()
        self.fail_all(error)

    def job_ids(self) -> list[str]:
        """The ids of the jobs this client waits for."""
        return self._futures.job_ids()

    def take_in_doubt(self) -> list[JobRequest]:
        """The batches whose submit lost its connection (see UnsentBatches.refused), handed over."""
        return self._futures.take_in_doubt()

    def resolve(self, outcome: Outcome) -> None:
        """Resolve a job's future with its outcome (nothing if it has none any more)."""
        future = self._futures.pop(outcome.job_id)
        if future is None:
            return
        segment = future.segment
        if segment and self.pool is not None:  # the job has ended: its segment is free
            self.pool.returned(segment)
        if outcome.error_kind == OutcomeKind.CANCELLED:  # by another client, or through a job id
            settle_cancelled(future)
            return
        if not future.set_running_or_notify_cancel():
            return
        if outcome.ok:
            try:
                future.set_result(loads(outcome.payload))
            except BaseException as exc:
                future.set_exception(
                    ResultUnpicklingError(
                        f"job {outcome.job_id}: the result could not be unpickled here: {exc!r}"
                    )
                )
            return
        future.set_exception(remote_exception(outcome))

    def fail(self, job_ids: list[str], error: MpschedError) -> None:
        """Fail the futures of these jobs, of those this client still has."""
        for future in self._futures.pop_many(job_ids):
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def fail_all(self, error: MpschedError) -> None:
        """Fail every future this client has."""
        for future in self._futures.pop_all():
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is unsent, close this client's mailbox, wait for the result thread
        (which stops reconnecting, if it was)."""
        self.link.close()
        if self.outbox is not None:
            self.outbox.close(timeout)
        with contextlib.suppress(*DISCONNECTED):
            self.service.close_client(self.client_id)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
