"""How a manager serves, step by step, once its queue and journal are open.

It arms the schedules the store kept, listens, starts what serves beside the service (the
link to a shared store, the status server, the local workers) and says it is ready. Then
the supervisor runs in this thread until a stop; the manager drains, stops its workers and
lets clients collect their last outcomes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from mpsched._errors import ConfigError, MpschedError, StoreError
from mpsched._manager.service import ManagerService
from mpsched._manager.shared_journal import SharedJournal, encode_status
from mpsched._manager.shared_link import SharedLink
from mpsched._manager.supervisor import Supervisor
from mpsched._protocol.proxy import ServiceManager, serve_object
from mpsched._protocol.records import STOP, STOP_NOW, ManagerConfig, ManagerFailed, ManagerReady
from mpsched._transport.address import format_address
from mpsched._transport.authkey import scrub_authkey_env
from mpsched._transport.sockets import SERIALIZER, HardenedServer
from mpsched._transport.tls import set_tls
from mpsched._worker.claims import LocalClaims
from mpsched._worker.slot_file import SlotFile, SlotSource

if TYPE_CHECKING:
    from mpsched._manager.http.server import StatusServer

log = logging.getLogger("mpsched.manager")


class LocalWorkers(NamedTuple):
    """The local workers' claim slots: the queue's, and where they are made."""

    claims: LocalClaims
    slots: SlotSource


@dataclasses.dataclass
class _Serving:
    """What a serving manager started, filled in step by step, for its stop to stop."""

    grace: float  # seconds the running jobs get to finish once it stops
    now: bool = False  # the owner asked for the running jobs to be killed (a second Ctrl-C)
    link: SharedLink | None = None
    status: StatusServer | None = None


def serve(
    config: ManagerConfig,
    control: Connection | None,
    on_ready: Callable[[ManagerReady, ManagerService], None] | None,
    service: ManagerService,
    recovered: str,
    workers: LocalWorkers,
) -> int:
    """Serve ``service`` until it is told to stop, then drain and stop; returns an exit
    code (see mpsched._manager.main.run_manager)."""
    recovered_lines = _recover_schedules(config, service, recovered)
    server = _listen(config, service)
    supervisor = Supervisor(service, config, server.address, *workers)
    serving = _Serving(grace=config.drain_timeout)
    try:
        failure, error = _start_up(config, control, service, supervisor, server.address, serving)
        if failure:
            if control is not None:
                control.send(ManagerFailed(failure, error))
            log.error("manager start-up failed: %s", failure)
            return 1
        ready = ManagerReady(
            address=server.address,
            pid=os.getpid(),
            recovered=recovered_lines,
            http_url="" if serving.status is None else serving.status.url,
        )
        if control is not None:
            control.send(ready)
        if on_ready is not None:
            on_ready(ready, service)
        reason = supervisor.watch(control)
        serving.now = reason == STOP_NOW
        if reason != STOP:
            serving.grace = 0.0
        return 0
    finally:
        _shut_down(config, service, supervisor, workers.slots, serving)


def _recover_schedules(
    config: ManagerConfig, service: ManagerService, recovered: str
) -> tuple[str, ...]:
    """Arm the schedules the store kept; returns what was recovered, one line each."""
    service.schedules.keep_cancelled_for(config.result_ttl)
    summary = service.schedules.recover()
    if summary:
        log.info("%s", summary)
    return tuple(line for line in (recovered, summary) if line)


def _listen(config: ManagerConfig, service: ManagerService) -> HardenedServer:
    """Serve ``service`` at the config's address, accepting connections in a thread of
    their own; returns the server."""
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
    return server


def _start_up(
    config: ManagerConfig,
    control: Connection | None,
    service: ManagerService,
    supervisor: Supervisor,
    address: Any,
    serving: _Serving,
) -> tuple[str, StoreError | ConfigError | None]:
    """Start the shared store's link, the status server and the local workers, in
    ``serving``; returns why start-up failed ("" if it did not) and the store's error.

    Raises:
        StoreError, ConfigError: (without ``control``) the shared store's link failed.
    """
    serving.link, error = _link(service, address)
    if error is not None and control is None:
        raise error  # serve says it as it does when the store cannot be opened
    failure = "" if error is None else str(error)
    if not failure:
        serving.status, failure = _start_status(config, service, control is None)
    failure = failure or _start(supervisor, config)
    if not failure and serving.link is not None:
        serving.link.beat_now()  # its status, with the workers that joined
    return failure, error


def _shut_down(
    config: ManagerConfig,
    service: ManagerService,
    supervisor: Supervisor,
    slots: SlotSource,
    serving: _Serving,
) -> None:
    """Stop the service, drain or kill the running jobs, stop the workers and what
    ``serving`` started, and let clients collect their last outcomes."""
    grace = serving.grace
    service.stop()
    if serving.now:  # the owner asked for the running jobs to be killed (a second Ctrl-C)
        log.info("stopping now: killed %d worker(s) running a job", supervisor.kill_busy())
    elif not service.wait_drained(grace):
        log.warning("jobs still running after %.0f s; stopping their workers", grace)
    if serving.status is not None:  # it showed the drain; nothing is left to show
        serving.status.stop()
    supervisor.stop_workers(grace=2.0)
    if isinstance(slots, SlotFile) and service.wait_drained(0.0):
        slots.remove()  # no job left running: nothing in it to read
    if serving.link is not None:
        serving.link.stop()  # after the workers: their last ends are in the store
    # A remote worker must hear the stop (or its dismissal) before the sockets close: one
    # that finds them closed first says it lost its manager, and a dismissed one would wait
    # for the manager to come back. A worker still running a job is not waited for past 2 s.
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
