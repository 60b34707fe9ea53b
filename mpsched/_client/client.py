"""The client side: Client (the Executor API) and connect().

A Client holds a named collaborator for each of its roles and delegates to it: the submit
path (mpsched._client.submit_path), jobs with parents (mpsched._client.dependents), the
limits it knows (mpsched._client.known_limits), lookups by id (mpsched._client.lookups),
recurring schedules (mpsched._client.recurring) and closing (mpsched._client.closing).
Its futures, outbox and result thread are its core (mpsched._client.core).
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
from mpsched._client.recurring import RecurringJobs, RunTerms, ScheduleRequest, SlotRules
from mpsched._client.schedule_handle import Schedule
from mpsched._client.submit_path import MEDIUM, SubmitPath
from mpsched._core.job import (
    DEFAULT_QUEUE,
    JobInfo,
    JobStateLike,
    Priority,
    check_job,
    due_arguments,
)
from mpsched._core.options import CatchupLike, ModeLike, OnErrorLike, OverlapLike
from mpsched._core.recurring import ScheduleKind
from mpsched._core.result_of import made as result_of_made
from mpsched._core.result_of import result_parents
from mpsched._core.retrying import RetryPolicy
from mpsched._errors import InvalidJobError
from mpsched._protocol.proxy import ServiceProxy
from mpsched._protocol.records import Stats

P = ParamSpec("P")
T = TypeVar("T")


class Client(Executor):
    """Submits jobs to a running manager and resolves their futures.

    Use :class:`Scheduler`, which also starts the manager and its workers. The path of one
    job from :meth:`submit` to its result, step by step: docs/architecture.md.
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
        self._dependents = DependentJobs(core, self._limits, self._submits)
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

        Args:
            delay: seconds (or a timedelta) from now; negative means now.
            at: when, as epoch seconds or a datetime (naive means local time); past means now.
            priority: among jobs due at the same time, HIGH runs before MEDIUM before LOW.
                A Priority or its name, in any case.
            timeout: seconds the job may run (from when a worker takes it); past that its
                worker's process tree is killed, the worker replaced, and the future fails
                with JobTimeoutError.
            retries: how many more times to run the job if its worker dies under it
                (killed, segfault, ``os._exit``). A job that raises is not retried by it.
            retry: a :class:`RetryPolicy`, or an int n for ``RetryPolicy(n)``: run the job
                again, with back-off, when it raises what the policy retries; a worker's
                death counts against the same budget. Not with ``retries``.
            key: an idempotency key. While a job with this key is pending or running (or,
                with a store, its outcome is retained), this returns that job's future
                instead of queueing a duplicate, whichever client submitted it.
            queue: the queue it waits in: only workers that serve this queue run it
                (1 to 64 characters of letters, digits and ``_.:-``).
            limit: a limit the manager declares (``Scheduler(limits=...)``): the job
                starts only while that limit has room, and waits pending meanwhile.
            after: jobs this one runs after: their futures (of any client) or job ids.
                It waits until each has ended, then becomes due at its own time (``delay``
                and ``at`` count from this call; a time past means at once). A
                ``ResultOf(f)`` among the arguments adds ``f`` to them, and stands for its
                result when the job starts.
            allow_failure: run the job even when a parent failed or was cancelled (its
                ``ResultOf`` is then the parent's exception). Without it the job fails at
                once with DependencyFailedError, and so do the jobs after it.

        Without ``delay`` and ``at`` the job is due now.

        Raises:
            InvalidJobError: both times, a NaN, infinite or overflowing time, an unknown
                priority, a timeout that is not a positive number, negative retries,
                ``retry`` with ``retries``, a bad queue name, a limit the manager does not
                know, or ``fn`` not callable.
            JobPicklingError: ``fn`` or its arguments cannot be pickled.
            JobNotFoundError: a parent the manager does not know (never, or forgotten).
            QueueFullError: ``max_pending`` jobs, or ``max_pending_bytes`` bytes of their
                payloads, were pending for all of ``submit_timeout`` (``unit`` says which).
            SchedulerShutdownError: after ``shutdown()``.
            ManagerConnectionLostError: (also a SchedulerShutdownError) the connection to
                the manager is lost: a client of ``connect()`` raises it at once until it
                has reconnected by itself; a Scheduler's client for good.

        On any error nothing was queued, but for one case: a submit sent synchronously
        (``max_pending``, or a ``key``) whose connection broke during its call may have
        reached the manager (submit a keyed job again: its key finds it).
        """
        if (
            after is not None
            or allow_failure
            or (result_of_made() and result_parents(args, kwargs))
        ):
            return self._dependents.schedule(
                fn,
                args,
                kwargs,
                delay,
                at,
                priority,
                timeout,
                retries,
                key,
                after,
                allow_failure,
                retry,
                queue,
                limit,
            )
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

        Every item is pickled first (the callable once), then all jobs are queued in call
        order: handed to the write-behind sender, or with ``max_pending`` sent in batches
        of up to 256 per manager call. ``chunksize`` is checked as ProcessPoolExecutor
        checks it, then ignored: each item is still its own job, in heap order.
        ``timeout`` counts from this call; when it passes, or the iterator is closed
        early, the jobs not yet started are cancelled.

        Raises:
            InvalidJobError: ``chunksize`` is not an int of at least 1.
            JobPicklingError: ``fn`` or an item cannot be pickled; nothing was queued.
            QueueFullError, SchedulerShutdownError: as :meth:`schedule`; the jobs of this
                call already queued are cancelled (those already started still run).
        """
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise InvalidJobError(f"chunksize must be an int >= 1, not {chunksize!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        return MapResults(self._core, self._submits.map(fn, iterables), deadline)

    def every(
        self,
        interval: float | timedelta,
        fn: Callable[..., Any],
        /,
        *args: Any,
        mode: ModeLike = "rate",
        start: float | timedelta | datetime | None = None,
        id: str | None = None,
        overlap: OverlapLike = "skip",
        catchup: CatchupLike = "latest",
        jitter: float = 0.0,
        on_error: OnErrorLike = "continue",
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn(*args, **kwargs)`` every ``interval`` seconds (or a timedelta).

        Args:
            mode: "rate": runs are planned at start + k * interval (no drift); "delay":
                each run is planned ``interval`` after the previous one ended.
            start: the first run: a delay in seconds or a timedelta, epoch seconds (a
                number from 1e9, i.e. 2001, on) or a datetime. Default: one interval from
                now. A start in the past is caught up as ``catchup`` says.
            id: the schedule's name. Adding a schedule whose id exists is an upsert: the
                same spec changes nothing, a changed one replaces it and keeps its last run.
                Default: the callable's name and a digest of what and when it runs.
            overlap: when a slot comes while the previous run is pending or running:
                "skip" it (counted), "queue" it until that run ends, or "allow" both.
            catchup: slots missed (manager down, backlog): "latest" runs one of them (the
                latest), "all" runs each, "skip" none; all are counted and logged.
            jitter: each run starts up to this many seconds after its slot, the same
                offset for a slot whichever manager plans it.
            on_error: "continue" (a failed run does not stop the schedule) or "pause".

        ``priority``, ``timeout``, ``retries``, ``retry``, ``queue`` and ``limit`` are as
        for :meth:`schedule`, for every run; each run gets the retry policy and a budget of
        its own. Each run is a job with id ``"{id}@{planned UTC time}"``. Returns the
        :class:`Schedule`; it lives in the manager, beyond this client.

        Raises:
            InvalidJobError: a bad interval, start, option or id. JobPicklingError: ``fn``
            or its arguments cannot be pickled. StoreError: it could not be recorded.
        """
        asked = ScheduleRequest(
            kind=ScheduleKind.EVERY, interval=interval, mode=mode, start=start, schedule_id=id
        )
        rules = SlotRules(overlap=overlap, catchup=catchup, jitter=jitter, on_error=on_error)
        run = RunTerms(
            priority=priority,
            timeout=timeout,
            retries=retries,
            retry=retry,
            queue=queue,
            limit=limit,
        )
        return self._recurring.add(asked._replace(rules=rules, run=run), fn, args, kwargs)

    def cron(
        self,
        expr: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        tz: str | None = None,
        id: str | None = None,
        overlap: OverlapLike = "skip",
        catchup: CatchupLike = "latest",
        jitter: float = 0.0,
        on_error: OnErrorLike = "continue",
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn(*args, **kwargs)`` at the times of a five-field cron expression,
        evaluated in zone ``tz`` (an IANA name; default: the manager's local zone) with
        Debian cron's DST rules: a daily 02:30 job runs at 03:00 on the spring-forward
        day and once on the fall-back day. Needs ``pip install 'mpsched[cron]'``.

        The other options are those of :meth:`every`.

        Raises:
            ExtraMissingError: cronsim is not installed, here or in the manager (an
                ImportError); its message says which process lacks it.
            InvalidJobError: an invalid expression or an unknown zone; as :meth:`every`.
        """
        asked = ScheduleRequest(kind=ScheduleKind.CRON, cron=expr, tz=tz, schedule_id=id)
        rules = SlotRules(overlap=overlap, catchup=catchup, jitter=jitter, on_error=on_error)
        run = RunTerms(
            priority=priority,
            timeout=timeout,
            retries=retries,
            retry=retry,
            queue=queue,
            limit=limit,
        )
        return self._recurring.add(asked._replace(rules=rules, run=run), fn, args, kwargs)

    def schedules(self) -> list[Schedule]:
        """Every schedule of the manager, whichever client added it."""
        return self._recurring.all()

    def get_schedule(self, schedule_id: str) -> Schedule:
        """The handle of one schedule of the manager, by its id.

        Raises:
            ScheduleNotFoundError: the manager has no such schedule (its ``cancelled`` is
                True for one cancelled within ``result_ttl``).
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._recurring.get(schedule_id)

    def limits(self) -> dict[str, str]:
        """The manager's limits by name, each in its form (``"2"``, ``"10/s"``,
        ``"2,10/s"``; ``""`` for one without a bound)."""
        return self._limits.fetch()

    def set_limit(
        self, name: str, *, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Declare or change the limit ``name`` on the manager, at once and for every
        client; kept in the store when there is one.

        Args:
            concurrency: at most this many of its jobs run at once (None: no bound).
            rate: at most N starts in any second, minute or hour: ``"10/s"``, ``"N/m"``,
                ``"N/h"`` (None: no bound).

        Raises:
            InvalidJobError: a bad name, a bound below 1, or a rate in another form.
        """
        self._limits.declare(name, concurrency, rate)

    def stats(self) -> Stats:
        """Pending jobs per priority, in flight, completed, failed, workers and lateness.

        Jobs this client submitted (or cancelled) before the call are counted. Lateness is
        how long after its due time a job started, in seconds (p50, p90, p99, max over
        the last 10,000 jobs of workers that share the manager's clock); times are in
        seconds and memory in bytes throughout.

        Raises:
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.stats()

    def job(self, job_id: str) -> JobFuture[Any]:
        """A future for any job this manager knows by id: this client's, another client's
        (``submit`` prints the id), or, with a store, one from before a manager restart.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job: unknown, or ended and forgotten (ended jobs stay
                known for ``result_ttl``; without a store, the 100,000 latest at most).
            SchedulerShutdownError: this client is shut down.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.job(job_id)

    def jobs(self, state: JobStateLike | None = None, limit: int | None = None) -> list[JobInfo]:
        """The jobs the manager knows, in submission order: every client's, pending and
        running ones, and with a store the finished ones it retains.

        Args:
            state: only jobs in this state: "pending", "running", "done", "failed" or
                "cancelled".
            limit: at most this many.

        Raises:
            ConfigError: an unknown state, or a limit that is not a positive int.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.jobs(state, limit)

    def job_info(self, job_id: str) -> JobInfo:
        """One job the manager knows, as :meth:`jobs` lists it, looked up by its id.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job: unknown, or finished and forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.job_info(job_id)

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """Run a failed or cancelled job again: it is pending again, due now, under the
        same id, with its priority, timeout, retries and key, and no attempt made.

        Returns a new future for it (its end comes to this client, whichever submitted
        it). The job's arguments are kept while the job is (``result_ttl``).

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string; the job is pending,
                running or done; its arguments were not kept (they went through shared
                memory); its key is held by another job now.
            JobNotFoundError: no such job: unknown, or ended and forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.requeue(job_id)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job by id, whichever client submitted it; True if it was
        pending and will never run (its future, wherever it is, ends cancelled).

        Raises:
            ManagerConnectionLostError: the manager is unreachable and the job is another
                client's (one of this client's own returns False then, unless it was not
                sent yet: that one is taken back).
        """
        return self._lookups.cancel(job_id)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; stop once every outstanding future is done.

        Args:
            wait: block until all jobs finished and everything stopped. With False this
                returns at once and a background thread finishes the work (the program still
                waits for it before exiting, as with any Executor).
            cancel_futures: first cancel every job still pending in the heap.
        """
        self._closing.shutdown(wait, cancel_futures)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        """Leaving the ``with`` block: ``shutdown(wait=True)``, unless an exception leaves
        it (or a Ctrl-C comes while it waits): then the jobs not yet started are cancelled
        (as with ``cancel_futures=True``), one line on stderr (a logging warning) names the
        running jobs it waits for, and a Ctrl-C while it waits stops them at once and
        raises SystemExit(130), or KeyboardInterrupt in an interactive session (see
        ``Closing.leave_on``)."""
        self._closing.leave_block(exc)
        return False

    def detach(self) -> None:
        """Close this client without waiting for its jobs: every job already submitted
        reaches the manager and stays queued there, and runs. Futures whose outcome had
        arrived are resolved; every other future fails here with SchedulerShutdownError,
        and that job's outcome is discarded when it comes. (``submit`` without ``--wait``
        uses this.)"""
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
