"""The client side: Client (the Executor API) and connect().

A Client holds a named collaborator for each of its roles and delegates to it: the submit
path (mpsched._client.submit_path), jobs with parents (mpsched._client.dependents), the
limits it knows (mpsched._client.known_limits), lookups by id (mpsched._client.lookups),
recurring schedules (mpsched._client.recurring) and closing (mpsched._client.closing).
Its futures, outbox and result thread are its core (mpsched._client.core). Its calls about
the manager's schedules, limits and jobs by id are in mpsched._client.manager_calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Executor
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, overload

from mpsched._client.closing import Closing
from mpsched._client.core import ClientCore
from mpsched._client.dependents import DependentJobs
from mpsched._client.dialing import dial, opened
from mpsched._client.job_future import JobFuture, MapResults
from mpsched._client.known_limits import KnownLimits
from mpsched._client.lookups import Lookups
from mpsched._client.manager_calls import ManagerCalls
from mpsched._client.recurring import RecurringJobs
from mpsched._client.submit_path import MEDIUM, SubmitPath
from mpsched._core.job import (
    DEFAULT_QUEUE,
    Priority,
    check_job,
    due_arguments,
)
from mpsched._core.result_of import made as result_of_made
from mpsched._core.result_of import result_parents
from mpsched._core.retrying import RetryPolicy
from mpsched._errors import InvalidJobError
from mpsched._protocol.proxy import ServiceProxy

P = ParamSpec("P")
T = TypeVar("T")


class Client(ManagerCalls, Executor):
    """Submits jobs to a running manager and resolves their futures.

    Use :class:`Scheduler`, which also starts the manager and its workers. The path of one
    job from :meth:`submit` to its result, step by step: docs/architecture.md. Its calls
    about the manager's schedules, limits and jobs by id (:meth:`every`, :meth:`limits`,
    :meth:`job`...) are defined in mpsched._client.manager_calls.
    """

    def __init__(
        self,
        service: ServiceProxy,
        *,
        submit_timeout: float | None = None,
        reconnect: Callable[[], ServiceProxy] | None = None,
        lost_advice: str = "",
    ) -> None:
        """``submit_timeout``: as for :class:`Scheduler`. ``reconnect`` connects to the
        manager's address again, after the connection was lost (None: the client closes
        instead, its futures failed with ManagerConnectionLostError, whose message ends
        with ``lost_advice``)."""
        core = self._core = ClientCore(service, reconnect=reconnect, lost_advice=lost_advice)
        self._limits = KnownLimits(core.link)
        self._lookups = Lookups(core)
        self._submits = SubmitPath(core, self._limits, submit_timeout)
        self._dependents = DependentJobs(core, self._submits)
        self._recurring = RecurringJobs(core, self._limits, self._lookups.job)
        self._closing = self._closing_for(core)

    def _closing_for(self, core: ClientCore) -> Closing:
        """How this client closes (a Scheduler's also stops its manager)."""
        return Closing(core)

    @overload
    def schedule(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[T]: ...

    @overload
    def schedule(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[T]: ...

    def schedule(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[Any]:
        """Run ``fn(*args, **kwargs)`` on a worker at a time, returning its future.

        Without ``delay`` and ``at`` the job is due now. The user guide says more on each.

        Args:
            delay: seconds or a timedelta from now; negative means now.
            at: epoch seconds or a datetime; naive means local time, past means now.
            priority: HIGH, MEDIUM or LOW, or its name: the order of jobs due together.
            timeout: seconds the job may run once taken. Past it, its worker's process
                tree is killed and the future fails with JobTimeoutError.
            retries: runs the job again if its worker dies under it, not if it raises.
            retry: a :class:`RetryPolicy`, or n for ``RetryPolicy(n)``: runs it again,
                with back-off, when it raises. Not with ``retries``.
            key: an idempotency key: while its job is known, this returns that job's future.
            queue: the queue it waits in. Only workers that serve this queue run it.
            limit: a limit the manager declares. The job starts only while it has room.
            after: futures or job ids of jobs to run after. It becomes due at its own
                time once all ended. A ``ResultOf(f)`` argument adds ``f`` to them.
            allow_failure: run even if a parent failed or was cancelled.

        Raises:
            InvalidJobError: a bad time, priority, timeout, retries, queue or limit; both
                times; ``retry`` with ``retries``; or ``fn`` not callable.
            JobPicklingError: ``fn`` or its arguments cannot be pickled.
            JobNotFoundError: a parent the manager does not know.
            QueueFullError: the pending bound stayed full for all of ``submit_timeout``.
            SchedulerShutdownError: after ``shutdown()``, or when the connection is lost
                (its subclass ManagerConnectionLostError).

        On an error nothing was queued, but for one case: a synchronous submit whose
        connection broke may have arrived. Submit a keyed job again: its key finds it.
        """
        dependent = after is not None or allow_failure  # else only a ResultOf makes it one
        if dependent or (result_of_made() and result_parents(args, kwargs)):
            terms = (delay, at, priority, timeout, retries, key, after, allow_failure)
            return self._dependents.schedule(fn, args, kwargs, *terms, retry, queue, limit)
        delay, at = due_arguments(delay, at)  # checked: seconds from now, or epoch seconds
        level = Priority.coerce(priority).level
        check_job(level, delay, at, timeout, retries, key)  # the manager's check, here
        return self._submits.one(
            fn, args, kwargs, delay, at, level, timeout, retries, key, retry, queue, limit
        )

    @overload
    def submit(
        self, fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[Any]:
        """Run ``fn(*args, **kwargs)`` as soon as a worker is free, at MEDIUM priority.

        The ``Executor`` method: every keyword goes to ``fn``. A ``ResultOf`` among the
        arguments makes it wait for that job, as with :meth:`schedule`. Raises as
        :meth:`schedule`.
        """
        if result_of_made() and result_parents(args, kwargs):
            return self._dependents.schedule(
                fn, args, kwargs, None, None, Priority.MEDIUM, None, 0, None, None, False
            )
        return self._submits.one(fn, args, kwargs, 0.0, None, MEDIUM)  # due now

    @overload
    def map(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]: ...

    @overload
    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]: ...

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """``Executor.map``: one job per item, due now at MEDIUM, results in input order.

        Every item is pickled first, then all jobs are queued in call order.
        ``chunksize`` is checked as ProcessPoolExecutor checks it, then ignored.
        ``timeout`` counts from this call. When it passes, or the iterator is closed early,
        the jobs not yet started are cancelled.

        Raises:
            InvalidJobError: ``chunksize`` is not an int of at least 1.
            JobPicklingError: ``fn`` or an item cannot be pickled; nothing was queued.
            QueueFullError, SchedulerShutdownError: as :meth:`schedule`. The jobs of this
                call already queued are cancelled.
        """
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise InvalidJobError(f"chunksize must be an int >= 1, not {chunksize!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        return MapResults(self._core, self._submits.map(fn, iterables), deadline)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; stop once every outstanding future is done.

        Args:
            wait: block until all jobs finished and everything stopped. With False it
                returns at once; a thread finishes, and the program waits for it at exit.
            cancel_futures: first cancel every job still pending.
        """
        self._closing.shutdown(wait, cancel_futures)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        """Leave the ``with`` block: ``shutdown(wait=True)``.

        If an exception leaves it, or a Ctrl-C comes while it waits, the jobs not yet
        started are cancelled and a warning names the running ones. A Ctrl-C while it
        waits stops them at once and raises SystemExit(130), or KeyboardInterrupt in an
        interactive session."""
        self._closing.leave_block(exc)
        return False

    def detach(self) -> None:
        """Close this client without waiting: its submitted jobs stay queued, and run.

        Futures whose outcome arrived are resolved. Every other future fails with
        SchedulerShutdownError, and its outcome is discarded. ``submit`` without
        ``--wait`` uses this."""
        self._closing.detach()


def connect(
    address: str | tuple[str, int] | None = None,
    *,
    authkey: bytes | str | None = None,
    submit_timeout: float | None = None,
) -> Client:
    """A client of a running manager: the Scheduler API without local workers.

    Every connection the client needs is open when this returns (its result and sender
    threads' too): a manager that stops answering for a while after (SIGSTOP, a frozen VM)
    and then goes on only delays the client's calls and jobs.

    When the connection to the manager is lost (it was killed, stopped or restarted, or
    the network failed), the client reconnects by itself, retrying the address after
    0.1 s, then twice as long each time up to 5 s, with one WARNING per outage and one
    INFO line when it is back. Meanwhile every call that needs the manager (submit,
    ``map``, ``job``, ``stats``...) raises ManagerConnectionLostError at once and changes
    nothing. With a store, the manager knows the client's jobs after a restart: each
    outstanding future is re-attached by its job id and resolves when its job ends, and
    jobs not yet sent (or whose batch's reply was lost and which the manager never got)
    are sent once it is back. Without a store, every outstanding future fails with
    ManagerConnectionLostError when the connection is lost (a job not yet sent did not
    run; a job sent may have run, or may still run). A client that is shut down, or a
    manager there that refuses the client's key or versions, ends the reconnecting: the
    client then closes, its futures failed.

    Args:
        address: as the command line takes it (``"unix:/path"``, ``"host:port"``), or as
            ``Scheduler.address`` gives it (a socket path or a ``(host, port)`` pair);
            default: this user's local manager (``python -m mpsched serve`` without
            ``--address``), on its socket in the per-user runtime directory.
        authkey: the manager's key, as bytes or as text (``open(key_file).read()``,
            encoded in UTF-8 as the key file's bytes are); surrounding whitespace, such
            as the newline a key file ends with, is stripped. Default: the
            MPSCHED_AUTHKEY variable, else, for a local address (a Unix socket, loopback
            TCP), this user's local key that ``serve`` keeps in the runtime directory.
        submit_timeout: as for :class:`Scheduler`.

    Raises:
        AuthenticationError: no key, an unsafe key file or runtime directory, or the
            manager rejected the key.
        VersionMismatchError: this process runs another Python or cloudpickle version.
        ManagerUnreachableError: no manager answers at ``address`` (a ConnectionError):
            an unknown host, nothing listening, no answer to a TCP connect within
            ``CONNECT_TIMEOUT`` (10 s, mpsched._transport.connect), something that is not
            a manager, or one that stops answering (stalled, gone) while the client opens
            its threads' connections; with no address, also when no local manager has
            ever run as this user.
        ManagerBusyError: (a ManagerUnreachableError) the manager closed each of the
            client's connections during its handshake, tried again with back-off for
            ``CONNECT_TIMEOUT``: it made room for newer connections (a flood of idle
            ones), or it was stopping.
    """
    service, reconnect, shown = dial(address, authkey)
    return opened(
        lambda: Client(service, submit_timeout=submit_timeout, reconnect=reconnect),
        service,
        shown,
    )
