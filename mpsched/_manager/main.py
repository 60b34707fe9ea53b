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

import gc
import logging
import multiprocessing
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import NamedTuple

from mpsched._core.limits import LimitSpec, parse_limit
from mpsched._core.queue import JobQueue
from mpsched._core.queue_like import JobQueueLike
from mpsched._errors import StoreError
from mpsched._manager.journal import BaseJournal
from mpsched._manager.no_journal import NoJournal
from mpsched._manager.service import ManagerService
from mpsched._manager.serving import LocalWorkers, serve
from mpsched._manager.shared_journal import SharedJournal
from mpsched._manager.shared_queue import SharedQueue
from mpsched._manager.store_journal import Journal
from mpsched._manager.store_outage import StoreOutage
from mpsched._payload.segments import Segments
from mpsched._payload.shm import payload_size
from mpsched._protocol.records import (
    ManagerConfig,
    ManagerFailed,
    ManagerReady,
)
from mpsched._store.redis.store import RedisStore
from mpsched._store.redis.url import is_redis_url
from mpsched._store.sqlite import SQLiteStore
from mpsched._transport.sockets import host_name
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
        settle_collector()
        return serve(config, control, on_ready, service, recovered, LocalWorkers(claims, slots))
    finally:
        segments.close()
        journal.store.close()


def settle_collector() -> None:
    """Collect, then freeze every object alive now, for the life of this process.

    What a manager builds before it serves (modules, classes, its service, the jobs it
    recovered) lives as long as it does, and CPython's full collections would walk all of
    it again each time: about 30,000 objects before a single job, each walk a pause of
    every thread of the manager, dispatch included. Frozen, they are left out of every
    later collection. They are still freed when their last reference goes; only cycles
    among them are never collected, and those are the service's own, which live until
    the manager stops and its process exits. Called once, by run_manager: its process is
    the manager's (a Scheduler's manager process, or ``mpsched serve``).
    """
    gc.collect()
    gc.freeze()


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

    queue: JobQueueLike
    journal: BaseJournal
    recovered: str
    slots: SlotSource
    awaited: tuple[str, ...] = ()


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
