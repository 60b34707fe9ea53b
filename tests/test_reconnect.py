"""A ``serve`` killed with SIGKILL and started again at its address, while clients of this
process and thread hold connections to it: over TCP and over a Unix socket. And one that
stalls (SIGSTOP) just after a client connected, for longer than a handshake may take.

Managers are real ``python -m mpsched serve`` processes (tests/served.py), each killed by
its pid in the test, and by its process group when the test ends (the ``procs`` fixture).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.managers import dispatch  # type: ignore[attr-defined]
from pathlib import Path

import jobs
import pytest
import store_jobs
from processes import wait_for
from served import START_TIMEOUT, Manager, Processes, serve

import mpsched
from mpsched import ManagerConnectionLostError
from mpsched._client.core import ClientCore
from mpsched._protocol.proxy import ServiceProxy, connect_service
from mpsched._transport import connect
from mpsched._transport.connect import client_connection
from mpsched._transport.wire import FastConnection

pytestmark = pytest.mark.slow

WAIT = 60.0  # a result after a restart, on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Site:
    """Where a manager is started again and again: one address, one key."""

    procs: Processes
    address: str
    key_file: Path

    def start(self, *options: str) -> Manager:
        manager = serve(
            self.procs,
            "--address",
            self.address,
            "--authkey-file",
            str(self.key_file),
            "--workers",
            "1",
            *options,
        )
        assert manager.address == self.address
        return manager


@pytest.fixture(params=["tcp", "unix"])
def site(request: pytest.FixtureRequest, procs: Processes, tmp_path: Path) -> Site:
    key_file = tmp_path / "authkey"
    key_file.write_bytes(os.urandom(16).hex().encode())
    key_file.chmod(0o600)
    address = (
        f"127.0.0.1:{free_port()}" if request.param == "tcp" else f"unix:{procs.runtime_dir}/m.sock"
    )
    return Site(procs, address, key_file)


def kill(manager: Manager) -> None:
    """SIGKILL a manager by its pid and reap it (its workers exit on their own)."""
    os.kill(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()


@pytest.fixture
def client_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="mpsched.client")
    yield caplog


def said(caplog: pytest.LogCaptureFixture, words: str) -> int:
    """How many of the client's log records say ``words``."""
    return sum(words in r.getMessage() for r in caplog.records if r.name == "mpsched.client")


LOST = "lost the connection to the manager at"
BACK = "reconnected to the manager at"


def test_connect_again_in_the_same_thread_reaches_the_restarted_manager(
    site: Site, connect_client: Callable[[Manager], mpsched.Client]
) -> None:
    first = site.start()
    before = connect_client(first)
    assert before.submit(pow, 2, 5).result(timeout=WAIT) == 32
    kill(first)
    second = site.start()
    after = connect_client(second)  # at once: no dead connection of the first in the way
    assert after.submit(pow, 2, 6).result(timeout=WAIT) == 64


def test_with_a_store_outstanding_futures_resolve_after_the_restart(
    site: Site,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    client_log: pytest.LogCaptureFixture,
) -> None:
    store, log = str(tmp_path / "jobs.db"), str(tmp_path / "runs.log")
    first = site.start("--store", store)
    client = connect_client(first)
    due_later = client.schedule(jobs.noop, "due later", delay=3)
    running = client.schedule(store_jobs.hold, log, "running", 60.0, 0.1, retries=1)
    wait_for(lambda: "running" in store_jobs.read_log(log), START_TIMEOUT, "the job started")
    kill(first)
    wait_for(lambda: said(client_log, LOST), WAIT, "the client noticed")
    with pytest.raises(ManagerConnectionLostError, match="nothing was sent") as refused:
        client.submit(jobs.noop, "during the outage")
    assert refused.value.address == site.address

    site.start("--store", store)
    # The same futures, by the same job ids: the one due later runs when due, the one
    # that was running runs again (its retries allow it).
    assert due_later.result(timeout=WAIT) == "due later"
    assert running.result(timeout=WAIT) == "running"
    assert len(store_jobs.read_log(log)["running"]) == 2
    assert client.submit(jobs.noop, "after").result(timeout=WAIT) == "after"
    assert said(client_log, LOST) == 1 and said(client_log, BACK) == 1  # one outage


@pytest.mark.parametrize("site", ["unix"], indirect=True)  # the same on either transport
def test_after_a_reconnect_the_sender_s_connection_is_opened_by_the_reconnect(
    site: Site,
    connect_client: Callable[[Manager], mpsched.Client],
    client_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = site.start()
    client = connect_client(first)
    assert client.submit(pow, 2, 5).result(timeout=WAIT) == 32
    opened: list[tuple[str, str]] = []  # (the calling thread, the thread it is for)
    open_connection = ServiceProxy.open_connection

    def recording(proxy: ServiceProxy, thread_name: str) -> FastConnection:
        opened.append((threading.current_thread().name, thread_name))
        return open_connection(proxy, thread_name)

    monkeypatch.setattr(ServiceProxy, "open_connection", recording)
    kill(first)
    wait_for(lambda: said(client_log, LOST), WAIT, "the client noticed")
    site.start()
    wait_for(lambda: said(client_log, BACK), WAIT, "the client reconnected")
    assert client.submit(pow, 2, 6).result(timeout=WAIT) == 64
    # Not by the sender at its first send (a handshake there, caught in a stall of the
    # manager, would fail the batch), but by the reconnect, before submits go on.
    callers = [caller for caller, name in opened if name == "mpsched-sender"]
    assert callers and "mpsched-sender" not in callers, opened


def test_without_a_store_outstanding_futures_fail_and_new_submits_work_once_back(
    site: Site,
    connect_client: Callable[[Manager], mpsched.Client],
    client_log: pytest.LogCaptureFixture,
) -> None:
    first = site.start()
    client = connect_client(first)
    pending = client.schedule(jobs.noop, 1, delay=600)
    client.stats()  # it reached the manager
    kill(first)
    error = pending.exception(timeout=WAIT)
    assert isinstance(error, ManagerConnectionLostError), error
    assert error.address == site.address
    assert "without a store the manager keeps no outcome" in str(error)
    with pytest.raises(ManagerConnectionLostError, match="reconnects by itself"):
        client.submit(jobs.noop, 2)

    site.start()
    wait_for(lambda: said(client_log, BACK), WAIT, "the client reconnected")
    assert client.submit(jobs.noop, 3).result(timeout=WAIT) == 3
    assert sum(client.stats().pending.values()) == 0  # the job of 1 did not come back
    assert said(client_log, LOST) == 1


# ------------------------------------------------------------------------------ a stall

# The client's handshake deadline, here, and a stall of the manager that outlasts it.
SHORT_HANDSHAKE = 1.0
STALL = 2 * SHORT_HANDSHAKE


def test_a_manager_that_stalls_just_after_connect_costs_the_client_nothing(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    client_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1")
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", SHORT_HANDSHAKE)
    client = connect_client(manager)
    sent = client.submit(pow, 2, 5)
    # Stopped (a debugger, a frozen VM or container, a machine swapping) before the
    # client's threads have made a call: a handshake caught in the stall would time out.
    os.kill(manager.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(STALL)
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
    assert sent.result(timeout=WAIT) == 32
    assert client.submit(pow, 2, 6).result(timeout=WAIT) == 64
    assert said(client_log, LOST) == 0


def test_a_manager_that_stalls_while_a_client_opens_its_connections_is_unreachable(
    make_scheduler: Callable[..., mpsched.Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_scheduler(workers=1)

    def stalled(proxy: ServiceProxy, thread_name: str) -> FastConnection:
        # What the handshake of a thread's connection raises when the manager stops
        # answering after it accepted the client's first connection.
        raise TimeoutError("timed out")

    monkeypatch.setattr(ServiceProxy, "open_connection", stalled)
    with pytest.raises(mpsched.ManagerUnreachableError) as raised:
        mpsched.connect(s.address, authkey=s.authkey)
    assert "stopped answering while the client opened its connections" in str(raised.value)

    def turned_away(proxy: ServiceProxy, thread_name: str) -> FastConnection:
        raise mpsched.ManagerUnreachableError("here", "too many handshakes from this host")

    monkeypatch.setattr(ServiceProxy, "open_connection", turned_away)
    with pytest.raises(mpsched.ManagerUnreachableError) as raised:  # said as the manager said
        mpsched.connect(s.address, authkey=s.authkey)
    assert str(raised.value) == "no manager answers at here: too many handshakes from this host"
    monkeypatch.undo()
    with mpsched.connect(s.address, authkey=s.authkey) as client:  # the manager is fine
        assert client.submit(pow, 2, 5).result(timeout=WAIT) == 32


# ------------------------------------------------------------------------------ proxies


def test_dropping_another_proxy_leaves_a_new_client_s_opening_connection_alone(
    make_scheduler: Callable[..., mpsched.Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_scheduler(workers=1)
    other = connect_service(s.address, s.authkey)
    other.stats()  # a connection of this thread to that manager
    # The new client's result thread waits before its first call: until it makes one, the
    # connection the client opened with is the one that tells the manager it is alive.
    go = threading.Event()  # set by the test; the held result thread waits on it
    collect_loop = ClientCore._collect_loop

    def held(core: ClientCore, connection: FastConnection) -> None:
        assert go.wait(WAIT)
        collect_loop(core, connection)

    monkeypatch.setattr(ClientCore, "_collect_loop", held)
    client = mpsched.connect(s.address, authkey=s.authkey)
    try:
        opening = client._core.service._tls.connection
        del other
        gc.collect()  # its finalizer ran: it closed its own connections, and only those
        assert not opening.closed
        go.set()
        assert client.submit(pow, 2, 3).result(timeout=WAIT) == 8
    finally:
        go.set()
        client.shutdown()


def test_a_stray_decref_does_not_take_the_served_service_away(
    make_scheduler: Callable[..., mpsched.Scheduler], request: pytest.FixtureRequest
) -> None:
    s = make_scheduler(workers=1)
    proxy = connect_service(s.address, s.authkey)
    request.addfinalizer(proxy.discard)  # its connections close with the test
    # More than there are proxies of it (the Scheduler's, this one, its worker's), as
    # proxies of an earlier manager at the address would send, collected after a restart,
    # if the object they referred to had the same id there.
    for _ in range(8):
        with client_connection(s.address, s.authkey) as conn:
            dispatch(conn, None, "decref", (proxy._id,))  # type: ignore[attr-defined]
    assert proxy.stats().workers
    assert s.submit(pow, 2, 4).result(timeout=WAIT) == 16


def test_a_discarded_proxy_closes_its_connections_of_every_thread_and_calls_no_more(
    make_scheduler: Callable[..., mpsched.Scheduler],
) -> None:
    s = make_scheduler(workers=1)
    proxy = connect_service(s.address, s.authkey)
    proxy.stats()
    connections = [proxy._tls.connection]

    def call() -> None:
        proxy.stats()
        connections.append(proxy._tls.connection)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(WAIT)
    assert len(connections) == 2 and connections[0] is not connections[1]
    proxy.discard()
    assert all(conn.closed for conn in connections)
    with pytest.raises(OSError):  # this thread's connection is closed
        proxy.stats()
    failed: list[BaseException] = []

    def call_again() -> None:  # a thread with no connection yet opens none
        try:
            proxy.stats()
        except BaseException as exc:
            failed.append(exc)

    caller = threading.Thread(target=call_again)
    caller.start()
    caller.join(WAIT)
    assert len(failed) == 1 and isinstance(failed[0], EOFError), failed
