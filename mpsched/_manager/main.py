"""The manager process: one JobQueue served to clients and workers.

```
 clients                      manager process                          workers
 Scheduler / connect()        heap + lock + condition (JobQueue)       loop: take -> run -> report
   submit(JobRequest) ──────▶  seq, due, priority                ◀──── take(worker_id, report)
   cancel(job_id) ──────────▶  in-flight leases                  ────▶ Assignment(lease, payload)
   result thread ◀──────────   per-client result mailboxes       ◀──── ack / heartbeat (remote)
                               supervisor: local worker sentinels, remote heartbeats
```

Everything crosses through ``multiprocessing.managers``: each proxied call runs in the
server thread of the caller's connection, so a worker blocked in ``take`` blocks only its
own server thread, inside JobQueue's condition wait. No lock, condition or queue object
leaves this process, and job and result payloads stay opaque bytes here: the manager never
imports user code.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from mpsched._core.limits import LimitSpec, parse_limit
from mpsched._core.queue import JobQueue
from mpsched._errors import ConfigError, MpschedError, StoreError
from mpsched._manager.journal import BaseJournal, NoJournal
from mpsched._manager.service import ManagerService
from mpsched._manager.shared_journal import SharedJournal, encode_status
from mpsched._manager.shared_link import SharedLink
from mpsched._manager.shared_queue import SharedQueue
from mpsched._manager.store_journal import Journal
from mpsched._manager.store_outage import StoreOutage
from mpsched._manager.supervisor import Supervisor
from mpsched._payload.segments import Segments
from mpsched._payload.shm import payload_size
from mpsched._protocol.proxy import (
    ServiceManager,
    serve_object,
)
from mpsched._protocol.records import (
    STOP,
    STOP_NOW,
    ManagerConfig,
    ManagerFailed,
    ManagerReady,
)
from mpsched._store.redis.store import RedisStore
from mpsched._store.redis.url import is_redis_url
from mpsched._store.sqlite import SQLiteStore
from mpsched._transport.address import format_address
from mpsched._transport.authkey import scrub_authkey_env
from mpsched._transport.sockets import SERIALIZER, HardenedServer, host_name

if TYPE_CHECKING:
    from mpsched._manager.http.server import StatusServer
from mpsched._transport.tls import set_tls
from mpsched._worker.claims import LocalClaims
from mpsched._worker.slot_file import AnonymousSlots, SlotFile, SlotSource

log = logging.getLogger("mpsched.manager")


def run_manager(
    config: ManagerConfig,
    control: Connection | None = None,
    on_ready: Callable[[ManagerReady, ManagerService], None] | None = None,
) -> int:
    """Run a manager in this process until it is told to stop; returns an exit code.

    Args:
        control: a pipe to the process that started this one. It may send "stop"; when
            it closes (that process died, even by SIGKILL) the manager stops at once.
        on_ready: called once the manager listens and its workers have joined.

    Raises:
        StoreError: (without ``control``) the store cannot be opened or recovered; with
            ``control`` it is sent to the owner instead, and 1 is returned.
        ConfigError: (without ``control``; else sent as StoreError is) a live manager
            of the shared store runs with another ``order``.
    """
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    if control is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when we stop
    _fit_temp_dir()
    claims = LocalClaims()  # the local workers' claim slots, for prefetched jobs
    try:
        queue, journal, recovered, slots, awaited = _open_queue(config, claims)
    except StoreError as exc:
        if control is None:
            raise
        control.send(ManagerFailed(reason=str(exc), error=exc))
        return 1
    queue.set_on_returned(journal.requeued)  # revoked prefetched jobs are pending again
    segments = _segments(config)
    if isinstance(journal, SharedJournal):
        journal.hold_segments(segments)
    try:
        service = ManagerService(
            queue,
            heartbeat_timeout=config.heartbeat_timeout,
            journal=journal,
            segments=segments,
            drain_workers_on_stop=config.drain_workers_on_stop,
        )
        for worker_id in awaited:  # their jobs are in flight: see Journal.recover
            service.workers.await_worker(worker_id)
        return _serve(config, control, on_ready, service, recovered, _Workers(claims, slots))
    finally:
        segments.close()
        journal.store.close()


# The forkserver listens on a Unix socket in a directory multiprocessing makes in the temp
# directory: ``pymp-XXXXXXXX/listener-XXXXXXXX``, 34 bytes more, and a socket's path may
# have 107. Past this length (a deep TMPDIR) the manager could not start its workers.
MAX_TEMP_DIR = 70
SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _fit_temp_dir() -> None:
    """Make this process's temp directory one whose sockets' paths fit, if TMPDIR's does
    not: the first of SHORT_TEMP_DIRS this user may write to (said once at INFO)."""
    current = tempfile.gettempdir()
    if len(current) <= MAX_TEMP_DIR:
        return
    for candidate in SHORT_TEMP_DIRS:
        if os.access(candidate, os.W_OK | os.X_OK):
            log.info(
                "the temp directory %s is too long for the forkserver's socket; using %s",
                current,
                candidate,
            )
            tempfile.tempdir = candidate
            return


def run_owned(control: Connection) -> int:
    """Entry of a Scheduler's manager process (mpsched._manager.launcher): read the config
    its owner sends over ``control``, take the owner's multiprocessing authkey as this
    process's (its workers inherit it), then run as :func:`run_manager`; returns the exit
    code."""
    config = control.recv()
    assert isinstance(config, ManagerConfig), config
    if config.process_authkey:
        # Before any worker starts: multiprocessing hands each child its parent's key.
        multiprocessing.current_process().authkey = config.process_authkey
    return run_manager(config, control)


def _segments(config: ManagerConfig) -> Segments:
    """Shared memory for payloads where every worker and client can map it: a Scheduler's
    manager (its workers are local), without a store or with a Redis store (which holds
    every payload inline too: mpsched._payload.segments); not with SQLite, whose file
    holds each payload as the manager received it."""
    if config.store is not None and not is_redis_url(config.store):
        why = f"the store {config.store} keeps every payload"
    elif not config.shared_memory:
        why = "shared memory is off (Scheduler(shared_memory=False), or serve)"
    else:
        why = ""
    return Segments.start(not why, why)


class _Opened(NamedTuple):
    """What a manager serves from: its queue, its journal, what was recovered (one line),
    where its local workers' claim slots live, and the remote workers it awaits."""

    queue: JobQueue | SharedQueue
    journal: BaseJournal
    recovered: str
    slots: SlotSource
    awaited: tuple[str, ...] = ()


class _Workers(NamedTuple):
    """The local workers' claim slots: the queue's, and where they are made."""

    claims: LocalClaims
    slots: SlotSource


def _open_queue(config: ManagerConfig, claims: LocalClaims) -> _Opened:
    """The queue and its journal: in this manager's memory (a heap, journalled to the
    SQLite store the config names, if any), or in the Redis store it names, shared with
    the other managers of that store."""
    if config.store is not None and is_redis_url(config.store):
        store = RedisStore(config.store, result_ttl=config.result_ttl, order=config.order)
        queue = SharedQueue(
            store,
            manager_id=f"{host_name()}:{os.getpid()}:{secrets.token_hex(3)}",
            lease_timeout=config.lease_timeout,
            max_pending=config.max_pending,
            max_pending_bytes=config.max_pending_bytes,
            outage=StoreOutage(store.location),
            claims=claims,
        )
        queue.fence.on_change(claims.set_fence)  # local workers start nothing past it
        for name, form in config.limits:  # the store's, for every manager: this one's win
            queue.set_limit(name, parse_limit(name, form) if form else LimitSpec())
        return _Opened(queue, SharedJournal(store, queue), "", AnonymousSlots())
    local = JobQueue(
        order=config.order,
        max_pending=config.max_pending,
        max_pending_bytes=config.max_pending_bytes,
        sizer=payload_size,
        claims=claims,
    )
    opened = _open_journal(config, local)
    _declare_limits(config, opened)
    return opened


def _declare_limits(config: ManagerConfig, opened: _Opened) -> None:
    """The limits the store kept, then those of the config (kept in turn): a limit given
    at start wins over one set at run time before the restart."""
    for name, form in opened.journal.saved_limits().items():
        opened.queue.set_limit(name, parse_limit(name, form) if form else LimitSpec())
    for name, form in config.limits:
        spec = parse_limit(name, form) if form else LimitSpec()
        opened.journal.save_limit(name, str(spec))
        opened.queue.set_limit(name, spec)


def _open_journal(config: ManagerConfig, queue: JobQueue) -> _Opened:
    """The journal of the store the config names (none without one), its jobs back in
    ``queue``, what was recovered, and the slot file beside it."""
    if config.store is None:
        return _Opened(queue, NoJournal(queue, result_ttl=config.result_ttl), "", AnonymousSlots())
    store = SQLiteStore(config.store, durability=config.durability, result_ttl=config.result_ttl)
    journal = Journal(store, queue)
    try:
        slots = SlotFile(f"{config.store}-workers")  # under the store's lock: ours alone
        summary, awaited = journal.recover(queue.clock, slots.traces())
        slots.clear()
    except BaseException:
        store.close()
        raise
    if summary:
        log.info("%s", summary)
    return _Opened(queue, journal, summary, slots, tuple(awaited))


def _serve(
    config: ManagerConfig,
    control: Connection | None,
    on_ready: Callable[[ManagerReady, ManagerService], None] | None,
    service: ManagerService,
    recovered: str,
    workers: _Workers,
) -> int:
    service.schedules.keep_cancelled_for(config.result_ttl)
    summary = service.schedules.recover()
    if summary:
        log.info("%s", summary)
    recovered_lines = tuple(line for line in (recovered, summary) if line)
    serve_object(service)
    # The key is in config: workers and the jobs they run must not inherit it.
    scrub_authkey_env()
    set_tls(config.tls)  # the listener below, and this process's own connections
    # Not BaseManager.get_server(): it builds a plain Server and ignores _Server.
    server = HardenedServer(
        ServiceManager._registry,  # type: ignore[attr-defined]
        config.address,
        config.authkey,
        SERIALIZER,
    )
    server.on_disconnect = service.connection_closed
    # serve_client reads stop_event, which only serve_forever would create; we run the
    # accepter ourselves so that this thread can supervise.
    server.stop_event = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.accepter, name="mpsched-accept", daemon=True).start()
    supervisor = Supervisor(service, config, server.address, *workers)
    grace, now = config.drain_timeout, False
    status: StatusServer | None = None
    link: SharedLink | None = None
    try:
        link, error = _link(service, server.address)
        if error is not None and control is None:
            raise error  # serve says it as it does when the store cannot be opened
        failure = "" if error is None else str(error)
        if not failure:
            status, failure = _start_status(config, service, control is None)
        failure = failure or _start(supervisor, config)
        if failure:
            if control is not None:
                control.send(ManagerFailed(failure, error))
            log.error("manager start-up failed: %s", failure)
            return 1
        if link is not None:
            link.beat_now()  # its status, with the workers that joined
        ready = ManagerReady(
            address=server.address,
            pid=os.getpid(),
            recovered=recovered_lines,
            http_url="" if status is None else status.url,
        )
        if control is not None:
            control.send(ready)
        if on_ready is not None:
            on_ready(ready, service)
        reason = supervisor.watch(control)
        now = reason == STOP_NOW
        if reason != STOP:
            grace = 0.0
        return 0
    finally:
        service.stop()
        if now:  # the owner asked for the running jobs to be killed (a second Ctrl-C)
            log.info("stopping now: killed %d worker(s) running a job", supervisor.kill_busy())
        elif not service.wait_drained(grace):
            log.warning("jobs still running after %.0f s; stopping their workers", grace)
        if status is not None:  # it showed the drain; nothing is left to show
            status.stop()
        supervisor.stop_workers(grace=2.0)
        if isinstance(workers.slots, SlotFile) and service.wait_drained(0.0):
            workers.slots.remove()  # no job left running: nothing in it to read
        if link is not None:
            link.stop()  # after the workers: their last ends are in the store
        if config.drain_workers_on_stop:
            # A dismissed worker between two takes must hear it before the sockets close;
            # else it takes the stop for a restart and waits for the manager to come back.
            service.wait_workers_told(0.0 if grace == 0 else 2.0)
        service.mailboxes.close()
        # Let connected clients take the last outcomes before the sockets close.
        service.mailboxes.wait_collected(0.0 if grace == 0 else 5.0)


def _start_status(
    config: ManagerConfig, service: ManagerService, foreground: bool
) -> tuple[StatusServer | None, str]:
    """The status server the config asks for, serving; or why it could not start.

    Raises:
        StatusAddressError: (``foreground``: a ``serve``) its address cannot be bound.
    """
    if config.http is None:
        return None, ""
    # Imported here: a manager without a status page (most) starts ~0.1 s sooner.
    from mpsched._manager.http.server import StatusAddressError, StatusServer

    where = f"{config.http.host}:{config.http.port}"
    try:
        status = StatusServer(config.http, service)
    except OSError as exc:  # an address in use, or not this host's
        if foreground:
            raise StatusAddressError(where, exc) from exc
        return None, f"cannot serve HTTP on {where}: {exc}"
    except MpschedError as exc:  # TLS files that do not load
        return None, f"cannot serve HTTP on {where}: {exc}"
    status.start()
    return status, ""


def _link(
    service: ManagerService, address: Any
) -> tuple[SharedLink | None, StoreError | ConfigError | None]:
    """With a shared store: this manager registered in it, listening to it, renewing its
    leases (mpsched._manager.shared_link); and why not (None when it is): the store
    failed, or it runs in another order (ConfigError)."""
    journal = service.journal
    if not isinstance(journal, SharedJournal):
        return None, None
    queue = journal.shared_queue
    where, pid = format_address(address), os.getpid()

    def status() -> bytes:
        return encode_status(service.host, pid, where, service.workers.statuses(since=0.0)[0])

    link = SharedLink(
        journal.store,
        queue,
        journal,
        outage=queue.outage,
        status=status,
        on_schedule=service.schedules.sync,
    )
    queue.on_unregistered(link.beat_now)
    try:
        link.start()
    except (StoreError, ConfigError) as exc:  # the caller logs it
        return None, exc
    return link, None


def _start(supervisor: Supervisor, config: ManagerConfig) -> str:
    try:
        supervisor.start_workers()
        return str(supervisor.await_workers(config.start_timeout))
    except Exception as exc:
        log.exception("manager start-up failed")
        return f"{type(exc).__name__}: {exc}"
