"""A worker's reports that have not gone to its manager yet, and the thread that sends them
while the worker runs more of its batch.

A report rides on the worker's next take, so one round trip completes a job and asks for
the next. A worker handed several jobs at once (mpsched._core.prefetch) takes again only
after the last of them: the reports of the first ones would wait for the whole batch, and
one long job among short ones would hold the others' results back for as long as it runs.
So a report made while the batch goes on is *held*: if the batch is not over within
``REPORT_AFTER`` seconds, a reporter thread sends what is held in a call of its own (on its
own connection, so it never waits behind the main thread's take). While batches follow
each other the reporter looks every ``REPORT_AFTER`` seconds on its own, and is woken only
when the first report is held after it went idle (a wake-up per batch would cost more than
the round trips prefetching saves); it goes idle after ``REPORT_AFTER`` with nothing held,
so an idle worker's reporter sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mpsched._protocol.records import Report

log = logging.getLogger("mpsched.worker")

# How long a held report may wait for the end of its batch before the reporter sends it:
# a batch (at most BATCH_TIME of work: mpsched._core.prefetch) ends within it, its
# reports riding on its next take, unless a job of it runs far longer than the last.
REPORT_AFTER = 0.016
# How long a worker that leaves waits for a send under way (a manager that stopped
# answering: it leaves anyway; the reports it kept in its slot are read when it exits).
CLOSE_WAIT = 10.0


class Reports:
    """The reports a worker has not sent; ``send`` is what the reporter thread calls."""

    def __init__(self, send: Callable[[list[Report]], None], after: float = REPORT_AFTER) -> None:
        self._send = send
        self._after = after
        # Guards every field below. The reporter thread waits on _changed for a held report
        # to age, or for the next look (timed), or, idle, for one to be held (untimed);
        # hold() notifies it when it holds a report while the reporter is idle, close()
        # when it is to leave; close() waits on it too, for a send under way to end (the
        # reporter notifies when it has).
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pending: list[Report] = []
        self._oldest = 0.0  # when the oldest held report was made (monotonic)
        self._held = False  # some of _pending is held (the reporter may send it)
        self._recent = False  # a report was held since the reporter's last look
        self._sending = False  # the reporter is sending a batch
        self._idle = True  # the reporter waits untimed: a held report must wake it
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, report: Report) -> None:
        """A report to go with the next take (the batch is over)."""
        with self._lock:
            self._pending.append(report)

    def hold(self, report: Report) -> None:
        """A report made while the batch goes on: sent by the reporter thread if the batch
        is not over within REPORT_AFTER seconds."""
        with self._lock:
            self._pending.append(report)
            self._recent = True
            if not self._held:
                self._held = True
                self._oldest = time.monotonic()
                if self._idle:  # from now on it looks on its own, while batches follow
                    self._idle = False
                    self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="mpsched-reporter"
                )
                self._thread.start()

    def take_all(self) -> list[Report]:
        """Every report not sent yet, now the caller's to send (with a take)."""
        with self._lock:
            pending, self._pending, self._held = self._pending, [], False
            return pending

    def settle(self, timeout: float | None = None) -> bool:
        """Wait for a send under way to end (at most ``timeout`` seconds): then every
        report this worker handed over (with a take that returned, or to the reporter)
        has reached the manager. False if one is still under way."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._sending, timeout)

    def close(self) -> None:
        """Stop the reporter thread, after the send it may have under way: a worker that
        leaves must not be declared gone while one of its reports is still on its way."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        if self.settle(CLOSE_WAIT) and self._thread is not None:
            self._thread.join(CLOSE_WAIT)

    def _run(self) -> None:
        with self._lock:
            while not self._closed:
                if not self._held:
                    if self._idle:
                        self._changed.wait()  # until hold() or close()
                    else:  # batches may follow: look again in a while
                        self._recent = False
                        self._changed.wait(self._after)
                        # Nothing held since the last look, nor now: sleep until hold().
                        self._idle = not self._held and not self._recent
                    continue
                wait = self._oldest + self._after - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                batch, self._pending, self._held = self._pending, [], False
                self._sending = True
                self._lock.release()
                try:
                    self._send(batch)
                except Exception as exc:  # the main thread's next call finds out too
                    log.warning(
                        "could not send %d report(s) early (%s: %s)",
                        len(batch),
                        type(exc).__name__,
                        exc,
                    )
                finally:
                    self._lock.acquire()
                    self._sending = False
                    self._changed.notify_all()
