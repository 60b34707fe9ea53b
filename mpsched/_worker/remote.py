"""``python -m mpsched worker --connect``: a remote worker process (the pool that keeps
them is mpsched._worker.pool's).

A remote worker process (``remote_worker_main``) joins the manager, acknowledges each lease,
sends heartbeats and enforces its jobs' timeouts itself. It never reads the manager's clock:
the manager hands it a job when the job is due. When the manager goes away (killed, reset,
end of file) or stops (its queue closed: SIGTERM, as every restart of a service does), the
worker tries again with back-off, 0.1 s doubling to 5 s, for as long as it is not told to
drain, and joins again under a new id when a manager answers at the address. It leaves on
its own SIGTERM (drained), or when the manager dismisses it (``drain-workers``, or a stop
with ``--drain-workers-on-stop``): then its pool leaves too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection

import psutil

from mpsched._core.job import Lease
from mpsched._errors import (
    ManagerBusyError,
    SchedulerShutdownError,
    WorkerRetiredError,
)
from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    Exit,
    LeftBehind,
    WorkerLoad,
)
from mpsched._transport.address import format_address
from mpsched._transport.wire import FastConnection
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.loop import serve
from mpsched._worker.process import (
    Draining,
    DrainState,
    JobTimeouts,
    WorkerConfig,
    kill_tree,
    make_hello,
    setup_process,
)
from mpsched._worker.stop_reasons import LoopEnd

log = logging.getLogger("mpsched.remote")

RECONNECT_FIRST = 0.1  # seconds before the first retry of an unreachable manager
RECONNECT_MAX = 5.0  # the back-off doubles up to this
HEARTBEAT_THREAD = "mpsched-heartbeat"


def remote_worker_main(
    config: WorkerConfig,
    lifeline: Connection | None = None,
    joined: Callable[[str], None] | None = None,
    slot: ClaimSlot | None = None,
) -> LoopEnd:
    """Entry point of a remote worker process; returns why it ended: DISMISSED (the
    manager dismissed it: its pool leaves), DRAINED (SIGTERM) or RECYCLED (``max_tasks`` /
    ``max_memory``).

    Joins again under a new id when the manager declared it gone (a network cut longer than
    the heartbeat timeout), or went away or stopped and came back. ``joined`` is called with
    the id of each join, once the manager has registered it.

    ``slot`` (its pool's: mpsched._worker.pool_slots) records which job it enters and
    keeps its reports until the manager has them, under the id it last joined with; its
    pool reads it if it dies. Joining again, the worker first tells the manager what its
    last session left there (a manager that died, then came back with a store, may
    still hold those jobs for it).

    Raises:
        AuthenticationError, VersionMismatchError: the manager refused this worker.
        OSError, EOFError: no manager answered the first join (unless
            ``config.wait_for_manager``).
    """
    setup_process(config, lifeline)
    drain = DrainState()
    signal.signal(signal.SIGTERM, drain.on_sigterm)
    patient = config.wait_for_manager
    ended: LoopEnd | None = None
    for rejoin in itertools.count():
        worker_id = f"{config.worker_id}.{rejoin}"
        try:
            service, heartbeat_timeout = _join(
                config,
                worker_id,
                drain,
                patient=patient,
                outage_logged=ended in (LoopEnd.LOST, LoopEnd.STOPPED),
            )
        except Draining:
            return LoopEnd.DRAINED
        patient = True  # joined once: from now on an unreachable manager is an outage
        if slot is not None:
            _carry(service, slot, worker_id)
        if joined is not None:
            joined(worker_id)
        ended = _session(
            service, replace(config, worker_id=worker_id), heartbeat_timeout, drain, slot
        )
        if not _joins_again(ended, worker_id, config):
            return ended
        if ended in (LoopEnd.LOST, LoopEnd.STOPPED):
            service.discard()
    raise AssertionError("itertools.count() ended")  # pragma: no cover


def _joins_again(ended: LoopEnd, worker_id: str, config: WorkerConfig) -> bool:
    """Whether a worker whose session ended so joins again (saying why when it matters)."""
    where = format_address(config.address)
    if ended == LoopEnd.STOPPED:
        log.warning(
            "worker %s: the manager at %s stopped; joining it again once it is back",
            worker_id,
            where,
        )
    elif ended == LoopEnd.DISMISSED:
        log.info("worker %s: the manager at %s dismissed it; leaving", worker_id, where)
    return ended in (LoopEnd.LOST, LoopEnd.STOPPED, LoopEnd.RETIRED)


def _join(
    config: WorkerConfig, worker_id: str, drain: DrainState, *, patient: bool, outage_logged: bool
) -> tuple[ServiceProxy, float]:
    """Connect and say hello; returns the service and its heartbeat timeout.

    While ``patient``, an unreachable manager is retried with back-off; a busy one (it
    closed every handshake tried: ManagerBusyError) always is. An outage is logged once at
    WARNING (here, unless ``outage_logged``: serve() said it lost the manager), and the join
    that ends it at INFO.

    Raises:
        Draining: SIGTERM, before or while waiting.
        AuthenticationError, VersionMismatchError: the manager refused this worker.
        OSError, EOFError: the manager is unreachable and not ``patient``.
    """
    where = format_address(config.address)
    backoff = RECONNECT_FIRST
    since = time.monotonic()
    while True:
        service: ServiceProxy | None = None
        try:
            with drain.interruptible():
                service = connect_service(config.address, config.authkey)
                heartbeat_timeout = service.hello(
                    make_hello(worker_id, remote=True, queues=config.queues)
                )
        except (EOFError, OSError) as exc:
            if service is not None:
                service.discard()  # it went away after we connected
            if not patient and not isinstance(exc, ManagerBusyError):
                raise
            if not outage_logged:
                what = (
                    f"the manager at {where} is busy ({exc.reason})"
                    if isinstance(exc, ManagerBusyError)
                    else f"no manager answers at {where} ({exc})"
                )
                log.warning("worker %s: %s; retrying until it does", worker_id, what)
                outage_logged = True
        else:
            if outage_logged:
                log.info(
                    "worker %s: reconnected to the manager at %s after %.1f s",
                    worker_id,
                    where,
                    time.monotonic() - since,
                )
            return service, heartbeat_timeout
        with drain.interruptible():
            time.sleep(backoff)
        backoff = min(backoff * 2, RECONNECT_MAX)


def _carry(service: ServiceProxy, slot: ClaimSlot, worker_id: str) -> None:
    """Joined as ``worker_id``: tell the manager what the slot says the session before left
    (the reports it had not seen arrive; no job runs now), then name the slot for this
    one. A manager that cannot be told now is told at the next join."""
    previous = slot.owner()
    if previous and previous != worker_id:
        left = slot.left_behind()
        try:
            service.worker_exited(previous, None, LeftBehind(b"", left.ended))
        except (EOFError, OSError) as exc:
            log.warning(
                "worker %s: could not tell the manager what %s left (%s); telling "
                "it at the next join",
                worker_id,
                previous,
                exc,
            )
            return
        slot.forget_kept()
    slot.name(worker_id)


def _session(
    service: ServiceProxy,
    config: WorkerConfig,
    heartbeat_timeout: float,
    drain: DrainState,
    slot: ClaimSlot | None = None,
) -> LoopEnd:
    """Serve one joined connection; returns serve()'s end, or RETIRED (join again)."""
    # Several beats per timeout, whatever --heartbeat-interval says.
    interval = min(config.heartbeat_interval, heartbeat_timeout / 4)
    # The heartbeat thread's connection is opened here, before the thread starts: a
    # handshake of its own, caught in a stall of the manager, would time out and leave
    # the worker beating on nothing (see ServiceProxy.open_connection).
    try:
        connection = service.open_connection(HEARTBEAT_THREAD)
    except (EOFError, OSError) as exc:
        log.warning("worker %s: lost the manager just after joining (%s)", config.worker_id, exc)
        return LoopEnd.LOST
    # Set when this session ends; the heartbeat thread waits on it between beats.
    stop = threading.Event()
    threading.Thread(
        target=_heartbeats,
        args=(service, connection, config.worker_id, interval, stop),
        daemon=True,
        name=HEARTBEAT_THREAD,
    ).start()
    timeouts = JobTimeouts(functools.partial(_timed_out, service, config.worker_id))
    try:
        return LoopEnd(
            serve(
                service,
                config,
                _acknowledger(service, config.worker_id),
                drain,
                timeouts=timeouts,
                slot=slot,
            )
        )
    except WorkerRetiredError:
        log.warning("worker %s was declared gone by the manager; joining again", config.worker_id)
        return LoopEnd.RETIRED
    finally:
        stop.set()


def _acknowledger(service: ServiceProxy, worker_id: str) -> Callable[[Lease], None]:
    def acknowledge(lease: Lease) -> None:
        service.ack(worker_id, lease.lease_id)

    return acknowledge


def _heartbeats(
    service: ServiceProxy,
    connection: FastConnection,
    worker_id: str,
    interval: float,
    stop: threading.Event,
) -> None:
    """Beat every ``interval`` seconds on ``connection`` until ``stop`` is set, or the
    manager says this worker is gone or stopping (the session's own calls hear it too).
    A beat that fails (the connection broke, or a new one could not be opened) is not
    the end: the next one goes on a new connection, so a worker that still serves its
    job keeps saying so; if the manager is really gone, the session ends and sets
    ``stop``."""
    service.use_connection(connection)
    # The first beat goes at once: until it arrives, status shows no CPU or memory.
    me = psutil.Process()
    me.cpu_percent(None)
    failing = False
    while True:
        try:
            times = me.cpu_times()
            service.heartbeat(
                worker_id,
                WorkerLoad(
                    cpu_percent=me.cpu_percent(None),
                    rss=me.memory_info().rss,
                    cpu_seconds=times.user + times.system,
                ),
            )
        except (WorkerRetiredError, SchedulerShutdownError):
            return
        except (EOFError, OSError) as exc:
            if stop.is_set():
                return
            if not failing:
                log.info(
                    "worker %s: a heartbeat failed (%s); trying again in %.1f s",
                    worker_id,
                    exc,
                    interval,
                )
                failing = True
            broken = service.set_connection_aside()  # the next beat opens a new one
            if broken is not None:
                with contextlib.suppress(OSError):
                    broken.close()
        else:
            if failing:
                log.info("worker %s: heartbeats go through again", worker_id)
                failing = False
        if stop.wait(interval):
            return


def _timed_out(service: ServiceProxy, worker_id: str) -> None:
    log.warning("worker %s: job ran past its timeout; exiting", worker_id)
    kill_tree(os.getpid(), include_root=False)
    with contextlib.suppress(Exception):
        service.leave(worker_id, [])
    os._exit(Exit.JOB_TIMEOUT)
