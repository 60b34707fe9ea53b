"""Scheduler: a ``concurrent.futures.Executor`` whose jobs run at a time, by priority.

A Scheduler is a :class:`~mpsched._client.client.Client` that also owns its manager process
(which owns the worker processes): it starts it, waits until every worker has joined, and
stops it at shutdown, when dropped, or at interpreter exit. The manager is a fresh
interpreter that never imports the program's main module (mpsched._manager.launcher), so
a Scheduler starts the same from a top-level script, ``python -``, ``python -c``, a REPL
or a notebook.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from mpsched._client.client import Client
from mpsched._client.closing import Closing
from mpsched._client.core import ClientCore
from mpsched._client.forever import DroppedSchedules, wait_for_stop
from mpsched._client.manager_closing import ManagerClosing
from mpsched._core.job import Order, check_queues
from mpsched._core.limits import parse_limits
from mpsched._core.options import Durability, DurabilityLike
from mpsched._errors import (
    ConfigError,
    NothingToRunError,
    SchedulerShutdownError,
)
from mpsched._manager.launcher import ManagerProcess
from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    LEASE_TIMEOUT,
    ManagerConfig,
    StartMethod,
)
from mpsched._store.base import DAY, check_options
from mpsched._store.redis.server import check_store
from mpsched._store.redis.url import shown_store
from mpsched._transport.address import is_loopback
from mpsched._transport.http_access import HttpConfig, http_config, parse_http_address

log = logging.getLogger("mpsched.scheduler")


class Scheduler(Client):
    """Runs jobs at a scheduled time, in priority order, on a pool of worker processes.

    Starts a manager process, which starts ``workers`` worker processes. Use it as a
    context manager, or call :meth:`shutdown`. Leaving the ``with`` block on an exception
    or Ctrl-C cancels the jobs not started and waits for the running ones; a second Ctrl-C
    kills them. Schedules live in the manager: a script whose work is its schedules ends
    with :meth:`run_forever`. The user guide (docs/guide/) explains each option at length.

    Args:
        workers: number of worker processes; defaults to ``os.cpu_count()``.
        max_workers: the same, under ``ProcessPoolExecutor``'s name; give one of the two.
        mp_context: how the manager starts workers: "forkserver" (the default where
            available) or "spawn", or a multiprocessing context of one of them. Never "fork".
        order: "time" (due time, then priority, then submission) or "priority" (among jobs
            already due, priority first). Every manager of a Redis store has the same.
        max_pending: bound on jobs waiting in the heap; ``submit`` then waits for room.
        max_pending_bytes: bound on the bytes pending jobs' payloads hold; ``submit`` then
            waits the same way, and a job larger than the bound is refused.
        submit_timeout: longest ``submit`` waits for room (None: no limit).
        start_timeout: longest the constructor waits for the manager and workers.
        max_tasks_per_worker: a worker leaves after this many jobs and is replaced.
        max_memory_per_worker: a worker whose RSS exceeds this many bytes after a job leaves
            and is replaced. Both are checked between jobs: nothing is lost or run twice.
        store: a SQLite file that journals every job, or a Redis URL (``redis://``,
            ``rediss://``, ``unix://``; needs ``mpsched[redis]``) of a queue that several
            managers share. None: jobs live in the manager's memory only.
        durability: with a store, "sync" (acknowledged submits survive a power cut) or
            "process" (they survive a crash of the manager process, not of the machine).
        result_ttl: seconds finished jobs are kept with their outcomes (default: one day);
            also how long a cancelled schedule's latest runs stay listable.
        lease_timeout: with a Redis store, seconds after its last heartbeat that this
            manager is presumed dead by its peers, which then take back its jobs.
        shared_memory: large buffers (64 KiB or more) travel through shared memory where
            it can carry them (not with SQLite). False: always inline.
        http: a port on 127.0.0.1, or ``"HOST:PORT"`` on another loopback address (port 0:
            any free one), where the manager serves its status page, ``/metrics`` and a
            JSON API; ``http_url`` says where.
        http_token_file: a file only this user can read holding a token that every request
            must then carry; its holders may also cancel jobs and pause schedules.
        queues: the queues this Scheduler's workers serve, in strict order (None: every
            queue). A job waits in the queue it names (``schedule(..., queue=)``).
        limits: limits jobs may name (``schedule(..., limit=)``), by name: ``2`` (at most
            2 running at once), ``"10/s"`` (at most 10 starts in any second; also ``/m``,
            ``/h``), ``"2,10/s"`` (both). Kept in the store; changed by :meth:`set_limit`.

    Raises:
        ConfigError: a bad option (a ValueError), a non-loopback ``http`` address, a bad
            store URL, or an ``order`` other than the live managers' of a Redis store.
        AddressError: ``http`` is neither a port nor ``HOST:PORT``.
        AuthenticationError: ``http_token_file`` is unreadable, empty, or others may read it.
        ExtraMissingError: a Redis URL without mpsched[redis] installed.
        StoreError: the store cannot be opened within a few seconds (StoreLockedError:
            another manager holds it); a URL's password is never shown.
        MpschedError: the manager or its workers did not start.
        SystemExit: in a child that multiprocessing started for the program's own Process or
            pool, while it re-runs the unguarded main module; one logged line says what to add.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        max_workers: int | None = None,
        mp_context: str | Any = None,
        order: Order | str = Order.TIME,
        max_pending: int | None = None,
        submit_timeout: float | None = None,
        start_timeout: float = 60.0,
        max_tasks_per_worker: int | None = None,
        max_memory_per_worker: int | None = None,
        store: str | os.PathLike[str] | None = None,
        durability: DurabilityLike = "sync",
        result_ttl: float = DAY,
        max_pending_bytes: int | None = None,
        lease_timeout: float = LEASE_TIMEOUT,
        shared_memory: bool = True,
        http: str | int | None = None,
        http_token_file: str | os.PathLike[str] | None = None,
        queues: Sequence[str] | str | None = None,
        limits: Mapping[str, int | str] | None = None,
    ) -> None:
        workers = _worker_count(workers, max_workers)
        _check_bounds(max_tasks_per_worker, max_memory_per_worker, max_pending, max_pending_bytes)
        config = ManagerConfig(  # its options checked in this order
            durability=Durability.coerce(durability),
            result_ttl=_result_ttl(result_ttl),
            order=Order.coerce(order),
            store=_store(store, lease_timeout),
            queues=check_queues(queues),
            limits=tuple((name, str(spec)) for name, spec in parse_limits(limits).items()),
            authkey=secrets.token_hex(32).encode(),
            workers=workers,
            mp_method=_start_method(mp_context),
            max_pending=max_pending,
            start_timeout=start_timeout,
            log_level=logging.getLogger("mpsched").getEffectiveLevel(),
            max_tasks_per_worker=max_tasks_per_worker,
            max_memory_per_worker=max_memory_per_worker,
            max_pending_bytes=max_pending_bytes,
            shared_memory=bool(shared_memory),
            lease_timeout=float(lease_timeout),
            http=_status_page(http, http_token_file),
            # Over the control socket only: the workers share this process's key, so
            # that a multiprocessing.Manager's proxies travel in jobs.
            process_authkey=bytes(multiprocessing.current_process().authkey),
        )
        service, pid = self._start_manager(config, start_timeout)
        self.workers = workers
        super().__init__(
            service, submit_timeout=submit_timeout, lost_advice=_lost_advice(pid, self._store)
        )
        # A manager that dies without removing its segments leaves them to whoever stops it.
        self._manager_process.sweep_on_stop(self._core.shm_prefix)

    def _start_manager(
        self, config: ManagerConfig, start_timeout: float
    ) -> tuple[ServiceProxy, int]:
        """Start the manager of ``config`` and connect to it; returns its proxy and pid.
        The manager is stopped if this fails, or once this Scheduler is dropped."""
        process = ManagerProcess(config)
        self._manager_process = process
        try:
            ready = process.wait_ready(start_timeout)
            service = connect_service(ready.address, config.authkey)
        except BaseException:
            process.stop()
            raise
        self.address = ready.address
        # Where the manager serves its status page and metrics; None without ``http``.
        self.http_url: str | None = ready.http_url or None
        self.authkey = config.authkey
        self._store = None if config.store is None else shown_store(config.store)
        # Stops the manager if this Scheduler is dropped or the program exits without
        # shutdown(); runs before multiprocessing joins its children at exit.
        self._finalizer = multiprocessing.util.Finalize(self, process.stop, exitpriority=10)
        return service, ready.pid

    def _closing_for(self, core: ClientCore) -> Closing:
        """This Scheduler's closing, which stops its manager (see :class:`Client`)."""
        # Without a store, the schedules the manager holds end with it: said once.
        dropped = DroppedSchedules()
        if self._store is not None:
            dropped.hush()
        return ManagerClosing(
            core,
            process=self._manager_process,
            store=self._store,
            dropped=dropped,
            stop_manager=self._finalizer,
        )

    def run_forever(self) -> None:
        """Run this Scheduler's schedules and jobs until SIGTERM or Ctrl-C, then shut down.

        A script whose work is its schedules ends its ``with`` block with it; else leaving
        the block would stop the manager, and the schedules with it.

        - SIGTERM: shuts down as leaving the ``with`` block does (``shutdown(wait=True)``),
          then returns. The program's own SIGTERM handler is back by then: a second SIGTERM
          does what it did before (by default it ends the program, and the manager stops).
        - Ctrl-C: as a Ctrl-C that leaves the ``with`` block: jobs not started are
          cancelled (a store keeps those due later), one warning names the running ones,
          which it waits for; a second Ctrl-C kills them (SystemExit(130)).
        - Called from another thread, it sets no signal handler (Python allows that in
          the main thread only): it returns once the Scheduler is shut down.

        Without a store, the schedules end with the manager; with one, they stay in it for
        the next Scheduler or ``serve`` on it. No warning either way: the stop was asked.

        Raises:
            KeyboardInterrupt: the Ctrl-C, once shut down.
            NothingToRunError: at once, when the manager holds no schedule and no job
                pending or running: nothing would run until the signal.
            SchedulerShutdownError: at once, after shutdown.
            ManagerConnectionLostError: the manager was lost (it died); nothing restarts it.
        """
        self._check_something_to_run()
        closing = self._closing
        assert isinstance(closing, ManagerClosing)
        try:
            if wait_for_stop(self._core.link.closed):
                log.info("run_forever(): SIGTERM; shutting down")
                closing.dropped.hush()
            lost = self._core.link.refusal()
            self.shutdown(wait=True)
        except KeyboardInterrupt as interrupt:
            closing.dropped.hush()
            closing.leave_on(interrupt, "stopped run_forever()")
            raise
        if lost is not None:
            raise lost

    def _check_something_to_run(self) -> None:
        """Raise as :meth:`run_forever` does at once (see there)."""
        if self._core.closed:
            raise self._core.link.refusal() or SchedulerShutdownError(
                "run_forever() after shutdown: this Scheduler runs nothing more"
            )
        if self.schedules():
            return
        queue = self.stats().queue
        if not queue.in_flight and not sum(queue.pending.values()):
            raise NothingToRunError()

    def __repr__(self) -> str:
        return f"<Scheduler workers={self.workers} address={self.address!r}>"


def _status_page(
    http: str | int | None, token_file: str | os.PathLike[str] | None
) -> HttpConfig | None:
    """The status server ``http`` and ``http_token_file`` ask for; None: none.

    Raises:
        ConfigError: a token file without ``http``, or ``http`` on an address others can
            reach (a Scheduler has no TLS to serve it with).
        AddressError, AuthenticationError: as ``http_config``.
    """
    if http is None:
        if token_file is not None:
            raise ConfigError("http_token_file", token_file, "left out without http")
        return None
    if not is_loopback(parse_http_address(http)):
        raise ConfigError(
            "http",
            http,
            "a port (on 127.0.0.1) or a loopback 'HOST:PORT': a "
            "Scheduler has no TLS to serve another address with "
            "(python -m mpsched serve --http has)",
        )
    return http_config(http, token_file)


def _result_ttl(result_ttl: float) -> float:
    """``result_ttl``, checked as a store checks it.

    Raises:
        ConfigError: as ``check_options``.
    """
    check_options(result_ttl)
    return float(result_ttl)


def _store(store: str | os.PathLike[str] | None, lease_timeout: float) -> str | None:
    """``store`` as a string, checked with the options a store may refuse.

    Raises:
        ConfigError, ExtraMissingError: as ``check_store`` says.
    """
    store = None if store is None else os.fspath(store)
    check_store(store or "", lease_timeout=lease_timeout)
    return store


def _lost_advice(pid: int, store: str | None) -> str:
    """What a Scheduler's error says to do once its manager (``pid``) is gone."""
    kept = (
        ""
        if store is None
        else f"; its jobs not finished stay in the store {store} for the next Scheduler or "
        f"serve on it"
    )
    return (
        f"this Scheduler's manager (pid {pid}) is gone, and nothing restarts it: the "
        f"Scheduler takes no more jobs; start a new one{kept}"
    )


def _check_bounds(
    max_tasks_per_worker: int | None,
    max_memory_per_worker: int | None,
    max_pending: int | None,
    max_pending_bytes: int | None,
) -> None:
    """Raise ConfigError for a bound that is not a positive int (None: no bound; a bool
    is not a count, though Python calls it an int)."""
    for name, limit in (
        ("max_tasks_per_worker", max_tasks_per_worker),
        ("max_memory_per_worker", max_memory_per_worker),
        ("max_pending", max_pending),
        ("max_pending_bytes", max_pending_bytes),
    ):
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ConfigError(name, limit, "a positive int")


def _worker_count(workers: int | None, max_workers: int | None) -> int:
    """``workers`` or its alias ``max_workers``, checked; errors name the one given."""
    name, count = "workers", workers
    if max_workers is not None:
        if workers is not None:
            raise ConfigError(
                "max_workers", max_workers, "left out when workers is given (its alias): not both"
            )
        name, count = "max_workers", max_workers
    if count is None:
        return os.cpu_count() or 1
    if isinstance(count, bool) or not isinstance(count, int):
        raise ConfigError(name, count, "an int")
    if count < 1:  # ProcessPoolExecutor's wording, which callers may match on
        raise ConfigError(name, count, "greater than 0")
    return count


def _start_method(mp_context: str | Any) -> StartMethod:
    if mp_context is None:
        return StartMethod.default()
    method = mp_context if isinstance(mp_context, str) else mp_context.get_start_method()
    try:
        return StartMethod(method)
    except ValueError:
        raise ConfigError("mp_context", method, "a 'spawn' or 'forkserver' start method") from None
