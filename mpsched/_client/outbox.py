"""Write-behind submission: jobs wait here while the sender thread ships them in batches.

``submit()`` validates and pickles a job at the call site, registers its future and puts
the request here; the sender thread sends whatever has accumulated in one manager call.
While one call is in flight the next batch forms, so a burst of submits costs a few manager
calls instead of one each, and a lone submit is sent at once.

Only for unbounded queues: with ``max_pending`` a full queue must raise QueueFullError at
the call site, so the client sends synchronously instead.

While the client has lost its manager the outbox is paused: it takes no request, and sends
nothing until the client has reconnected and resumes it, with the new manager's proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mpsched._core.job import JobRequest
from mpsched._protocol.proxy import ServiceProxy
from mpsched._transport.wire import FastConnection

BATCH = 512  # requests per manager call at most
SENDER_THREAD = "mpsched-sender"  # the sender thread's name, and its connection's


class Outbox:
    """Requests not yet sent, in submission order, and the thread that sends them."""

    def __init__(
        self,
        service: ServiceProxy,
        on_failure: Callable[[list[JobRequest], BaseException], None],
        on_withdrawn: Callable[[list[JobRequest]], None] | None = None,
        on_sent: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_failure``: called with a batch that could not be sent and why (a refusal,
        a lost connection);
        ``on_withdrawn``: with requests taken back before they were sent; ``on_sent``:
        after each batch the manager took (all called without the lock).

        Raises:
            as :meth:`ServiceProxy.open_connection`: the sender's connection is opened here.
        """
        self._service = service
        self._on_failure = on_failure
        self._on_withdrawn = on_withdrawn
        self._on_sent = on_sent
        # Guards _service, _requests, _sending, _busy, _withdrawn, _paused, _closed and
        # _sender_waits. The sender thread waits on _queued for requests (and, paused, for
        # resume()); put() and withdraw() notify it when it waits, close() and resume()
        # always. Submitters and cancel() hold the lock only briefly.
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        # flush() and wait_idle() wait on _idle until nothing is queued or being sent; the
        # sender notifies it after each call to the manager, pause() when it pauses.
        self._idle = threading.Condition(self._lock)
        self._requests: dict[str, JobRequest] = {}  # by job id, in insertion order
        self._sending: set[str] = set()  # job ids of the batch on its way
        self._busy = False  # a call to the manager is on its way (maybe with no job in it)
        # Requests taken back before they were sent: the manager is told how many with
        # the next batch, so its counts agree with what the caller did.
        self._withdrawn = 0
        self._paused = False  # the manager is unreachable: take nothing, send nothing
        self._closed = False
        self._sender_waits = False  # the sender waits on _queued: put() must notify
        self._handover: FastConnection | None = None  # resume()'s connection, for the sender
        # Open before the first submit, so that no submit's handshake can be caught in a
        # stall of the manager (see ServiceProxy.open_connection).
        connection = service.open_connection(SENDER_THREAD)
        self._thread = threading.Thread(
            target=self._run, args=(service, connection), daemon=True, name=SENDER_THREAD
        )
        self._thread.start()

    def put(self, request: JobRequest) -> bool:
        """Queue a request; False (nothing queued) while paused."""
        with self._lock:
            if self._paused:
                return False
            self._requests[request.job_id] = request
            if self._sender_waits:
                self._queued.notify()
        return True

    def withdraw(self, job_id: str, timeout: float = 30.0) -> bool:
        """Take back a request not yet sent; True if it was still here.

        If it is on its way, wait until it has reached the manager (False), so that the
        caller can cancel it there.
        """
        with self._lock:
            request = self._requests.pop(job_id, None)
            if request is None:
                self._idle.wait_for(lambda: job_id not in self._sending, timeout)
                return False
            self._note_withdrawn_locked(1)
        if self._on_withdrawn is not None:
            self._on_withdrawn([request])
        return True

    def withdraw_all(self, *, counted: bool = True) -> list[str]:
        """Take back every request not yet sent; returns their ids. ``counted``: the
        manager is told how many (not for jobs that failed instead: the caller did not
        take them back)."""
        with self._lock:
            requests = list(self._requests.values())
            self._requests.clear()
            self._note_withdrawn_locked(len(requests) if counted else 0)
        if self._on_withdrawn is not None and requests:
            self._on_withdrawn(requests)
        return [request.job_id for request in requests]

    def _note_withdrawn_locked(self, count: int) -> None:
        self._withdrawn += count
        if count and self._sender_waits:
            self._queued.notify()

    def wait_sent(self, job_id: str, timeout: float = 30.0) -> bool:
        """Wait until the request of ``job_id`` (put earlier) has reached the manager or
        failed; at once when it has (or was never put here). Paused: at once, True only
        if it is no longer here."""
        with self._lock:
            return (
                self._idle.wait_for(
                    lambda: (
                        (job_id not in self._requests and job_id not in self._sending)
                        or self._paused
                    ),
                    timeout,
                )
                and job_id not in self._requests
            )

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every request put so far has reached the manager (or failed).
        Paused: at once, True only if nothing is left to send."""
        with self._lock:
            return (
                self._idle.wait_for(
                    lambda: (
                        self._paused
                        or (not self._requests and not self._busy and not self._withdrawn)
                    ),
                    timeout,
                )
                and not self._requests
            )

    def pause(self) -> None:
        """The manager is unreachable: refuse put() from now on, and send nothing after
        the call on its way (if any) until :meth:`resume`."""
        with self._lock:
            self._paused = True
            self._idle.notify_all()  # flush() and wait_sent() return

    def wait_idle(self) -> None:
        """Return once no call to the manager is on its way (after pause(): once the
        last one has been answered, or handed to ``on_failure``)."""
        with self._lock:
            self._idle.wait_for(lambda: not self._busy)

    def unsent(self) -> set[str]:
        """The job ids of the requests not sent yet."""
        with self._lock:
            return set(self._requests)

    def resume(
        self,
        service: ServiceProxy,
        resend: list[JobRequest],
        connection: FastConnection | None = None,
    ) -> None:
        """Send to ``service`` from now on, on ``connection`` (opened for the sender by
        the reconnect; None: its first send opens one), ``resend`` first (requests sent
        before whose manager never got them), then what was left unsent; take requests
        again."""
        with self._lock:
            self._service = service
            self._handover = connection
            if resend:
                self._requests = {**{r.job_id: r for r in resend}, **self._requests}
            self._paused = False
            self._queued.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Send what is left, then stop the sender thread."""
        with self._lock:
            self._closed = True
            self._queued.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self, service: ServiceProxy, connection: FastConnection) -> None:
        service.use_connection(connection)
        while True:
            with self._lock:
                while (
                    self._paused or (not self._requests and not self._withdrawn)
                ) and not self._closed:
                    self._sender_waits = True
                    try:
                        self._queued.wait()
                    finally:
                        self._sender_waits = False
                if self._paused or (not self._requests and not self._withdrawn):
                    return  # closed: what is left unsent, the client fails
                batch = [self._requests.pop(job_id) for job_id in list(self._requests)[:BATCH]]
                self._sending = {request.job_id for request in batch}
                self._busy = True
                withdrawn, self._withdrawn = self._withdrawn, 0
                service = self._service
                handover, self._handover = self._handover, None
            if handover is not None:
                service.use_connection(handover)
            try:
                service.submit(batch, None, withdrawn)
            except BaseException as exc:
                self._on_failure(batch, exc)
            else:
                self._on_sent()
            finally:
                with self._lock:
                    self._sending = set()
                    self._busy = False
                    self._idle.notify_all()
