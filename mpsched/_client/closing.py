"""How a client closes: ``shutdown``, leaving a ``with`` block (on an exception, or a
Ctrl-C while it waits), ``detach``, and the interpreter's exit.

A client still open when the interpreter exits is closed by a hook that runs with
threading's own exit hooks (see :func:`_close_at_exit`), in the process that made it only:
a child that fork made forgets its parent's clients (:func:`_forget_open_clients`).
A Scheduler's closing (mpsched._client.manager_closing) overrides the steps that differ for
a client that owns its manager: what the exit does (``exit_work``), what becomes of jobs
not started (``drop_not_started``), a second Ctrl-C (``stop_now``) and the last step
(``stop``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import weakref
from typing import Any

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._client.link import DISCONNECTED
from mpsched._errors import SchedulerShutdownError

log = logging.getLogger("mpsched.client")


class Closing:
    """The ways a client closes, and what each does with the jobs it has not seen end.

    A Scheduler's (mpsched._client.manager_closing) overrides the steps that differ for a
    client that owns its manager: :meth:`exit_work`, :meth:`drop_not_started`,
    :meth:`stop_now` and :meth:`stop`.
    """

    def __init__(self, core: ClientCore) -> None:
        self._core = core
        # Guards closer: shutdown() may be called from several threads. Held for a look
        # and a start; shutdown, detach, leave_on and the exit hook wait on it briefly.
        self._shutdown_lock = threading.Lock()
        self.closer: threading.Thread | None = None  # shutdown()'s, which drains and stops
        self._set_aside: list[Any] = []  # manager connections closed by stop() (leave_on)
        self._stopped = False  # stop() ran: nothing is left to drop, say or wait for
        _close_at_exit(self)

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        """As ``Client.shutdown``."""
        with self._shutdown_lock:
            first = self._core.shut()
            if first:
                if cancel_futures:
                    self._core.cancel_pending()
                self.closer = threading.Thread(target=self.drain_and_stop, name="mpsched-shutdown")
                self.closer.start()
            elif cancel_futures:
                self._core.cancel_pending()
            closer = self.closer
        if wait and closer is not None:
            _join(closer)

    def leave_block(self, exc: BaseException | None) -> None:
        """Leaving a ``with`` block, as ``Client.__exit__`` says."""
        if exc is None:
            try:
                self.shutdown(wait=True, cancel_futures=False)
            except KeyboardInterrupt as interrupt:
                self.leave_on(interrupt, "left the with block")
                raise
            return
        self.leave_on(exc, "left the with block")

    def leave_on(self, exc: BaseException, how: str, *, at_exit: bool = False) -> None:
        """An exception ends this client's work: take no more jobs, drop those not yet
        started (:meth:`drop_not_started`), say so and which running jobs it waits for
        (one warning line, which reaches stderr even where logging is not set up: the
        program was interrupted, and its user must learn why it does not end yet), and
        wait for them. A Ctrl-C during all that stops them now (:meth:`stop_now`), says
        so in one line, and raises SystemExit(130), as a shell reports a Ctrl-C (in an
        interactive session, KeyboardInterrupt: back to the prompt); at interpreter exit
        it just returns (the exit status is already the program's)."""
        with self._shutdown_lock:
            self._core.shut()
        closer = self.closer
        if self._stopped and (closer is None or not closer.is_alive()):
            return  # left already (run_forever() on a Ctrl-C, then its with block)
        again = "again " if isinstance(exc, KeyboardInterrupt) else ""
        try:
            self._set_connection_aside()  # ``exc`` may have cut a call short
            notes = self.drop_not_started()
            self._core.fail_watched(
                SchedulerShutdownError(
                    f"this client stopped waiting for the job: {type(exc).__name__} {how}"
                )
            )
            running = self._core.outstanding()
            if running:
                notes.append(
                    f"waiting for {count(len(running), 'running job')}: "
                    f"{self.describe(running)}; press Ctrl-C {again}to stop "
                    f"{'it' if len(running) == 1 else 'them'} now"
                )
            if notes:
                log.warning("mpsched: %s %s: %s", type(exc).__name__, how, "; ".join(notes))
            closer = self.closer
            if closer is not None:  # shutdown() began: its thread drains and stops
                _join(closer)
            else:
                self.drain_and_stop()
        except KeyboardInterrupt:
            self._set_connection_aside()
            log.warning("mpsched: Ctrl-C %s: %s", again.strip() or "while waiting", self.stop_now())
            if at_exit:
                return
            if hasattr(sys, "ps1"):  # an interactive session: back to its prompt
                raise KeyboardInterrupt from None
            raise SystemExit(130) from None

    def _set_connection_aside(self) -> None:
        connection = self._core.service.set_connection_aside()
        if connection is not None:
            self._set_aside.append(connection)

    def drop_not_started(self) -> list[str]:
        """Cancel this client's jobs that have not started; returns what it did, in
        clauses of one line (none for nothing)."""
        cancelled = self._core.cancel_pending()
        return [f"cancelled {count(cancelled, 'job')} not started"] if cancelled else []

    def stop_now(self) -> str:
        """Stop waiting for this client's running jobs; returns what became of them. They
        belong to a long-running manager: they run on, and their outcomes are dropped."""
        running = self._core.outstanding()
        described = self.describe(running) if running else ""
        self.stop()
        if not running:
            return "stopped waiting"
        runs = "runs" if len(running) == 1 else "run"
        return (
            f"stopped waiting; {count(len(running), 'running job')} {runs} on in the "
            f"manager: {described}"
        )

    def describe(self, futures: list[JobFuture[Any]], most: int = 3) -> str:
        """The jobs of ``futures`` as a line names them: callable and id, a few at most."""
        names: dict[str, str] = {}
        with contextlib.suppress(*DISCONNECTED):
            names = {r.job_id: r.name for r in self._core.service.jobs("running", None)}
        shown = [
            f"{names[f.job_id]} ({f.job_id})" if f.job_id in names else f.job_id
            for f in futures[:most]
        ]
        more = f" and {len(futures) - most} more" if len(futures) > most else ""
        return ", ".join(shown) + more

    def detach(self) -> None:
        """As ``Client.detach``."""
        with self._shutdown_lock:
            self._core.shut()
        self.stop()

    def at_exit(self) -> None:
        """The interpreter is exiting: later submits raise, and what this client already
        submitted is not lost (see :meth:`exit_work`). A program that ends on Ctrl-C
        (an uncaught KeyboardInterrupt) is treated as leaving a ``with`` block on it
        (:meth:`leave_on`), and so is a Ctrl-C while the exit waits for jobs."""
        interrupt = _ending_interrupt()
        with self._shutdown_lock:
            first = self._core.shut(exiting=True)
            closer = self.closer
        if interrupt is not None and (first or (closer is not None and closer.is_alive())):
            self.leave_on(interrupt, "ended the program", at_exit=True)
        elif first:  # else shut down already; a closer thread is joined by the interpreter
            try:
                self.exit_work()
            except KeyboardInterrupt as exc:
                self.leave_on(exc, "while the program exits", at_exit=True)

    def exit_work(self) -> None:
        """What the interpreter's exit does with this client's jobs."""
        # A client of a long-lived manager: what it submitted is sent, and runs there.
        self.stop()

    def drain_and_stop(self) -> None:
        """Wait until every outstanding future is done, then :meth:`stop`."""
        while futures := self._core.outstanding():
            concurrent.futures.wait(futures, _wake_interval())
        self.stop()

    def stop(self) -> None:
        """The last step: close the client's core and the connections set aside."""
        self._core.close()
        while self._set_aside:
            with contextlib.suppress(OSError):
                self._set_aside.pop().close()
        self._stopped = True


# The closings of clients still open, closed (oldest first) when the interpreter exits.
# The hook runs with threading's own exit hooks, as concurrent.futures' executors do:
# before atexit functions (multiprocessing's among them, which would stop a manager) and
# while the clients' daemon threads still run.
_open_clients: weakref.WeakSet[Closing] = weakref.WeakSet()
_exit_hook = threading.Lock()  # guards the one-time registration below; nobody waits on it
_exit_hook_registered = False


def _close_at_exit(closing: Closing) -> None:
    global _exit_hook_registered
    with _exit_hook:
        _open_clients.add(closing)
        if not _exit_hook_registered:
            threading._register_atexit(_close_open_clients)  # type: ignore[attr-defined]
            _exit_hook_registered = True


def _forget_open_clients() -> None:
    """In a child that fork made (a fork-started Process, a multiprocessing.Manager):
    the clients are its parent's. Its exit runs threading's exit hooks too, and must not
    close them (a Scheduler's would stop its manager, over the inherited socket)."""
    _open_clients.clear()


os.register_at_fork(after_in_child=_forget_open_clients)


def _close_open_clients() -> None:
    for closing in list(_open_clients):
        try:
            closing.at_exit()
        except Exception:
            log.exception("could not close %r at interpreter exit", closing)


# How often a wait in the main thread wakes up. A signal that lands just as the thread starts
# to block (after Python's last look for signals, before the lock wait) is not seen until
# the wait ends: a Ctrl-C would go unnoticed while a long job runs.
MAIN_THREAD_WAKE = 0.25


def _wake_interval() -> float | None:
    return MAIN_THREAD_WAKE if threading.current_thread() is threading.main_thread() else None


def _join(thread: threading.Thread) -> None:
    """``thread.join()``, in the main thread in slices of MAIN_THREAD_WAKE."""
    while thread.is_alive():
        thread.join(_wake_interval())


def _ending_interrupt() -> KeyboardInterrupt | None:
    """The KeyboardInterrupt the program is ending on, if it is (the interpreter records
    an uncaught exception as ``sys.last_value`` before it runs its exit hooks). Not in an
    interactive session: there it may be any Ctrl-C typed long before."""
    last = getattr(sys, "last_value", None)
    if isinstance(last, KeyboardInterrupt) and not hasattr(sys, "ps1"):
        return last
    return None


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 job", "2 jobs"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
