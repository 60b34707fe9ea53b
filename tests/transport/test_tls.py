"""TLS under the authkey handshake: certificates made at test time with the openssl CLI."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from processes import wait_for
from servers import KEY, InProcessServer, read_until_closed, trickle

import mpsched._transport.connect as connect
import mpsched._transport.sockets as transport
from mpsched import AuthenticationError, TlsError
from mpsched._protocol.proxy import ServiceManager
from mpsched._transport.connect import client_connection
from mpsched._transport.sockets import SERIALIZER
from mpsched._transport.tls import TlsConfig, current_tls, set_tls
from mpsched._transport.wire import FastConnection

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: TlsConfig  # signed by ca
    client: TlsConfig  # signed by ca
    other_ca: Path
    stranger: TlsConfig  # a client signed by other_ca


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    where = tmp_path_factory.mktemp("certs")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    def authority(name: str) -> None:
        openssl(
            "req",
            "-x509",
            *EC_KEY,
            "-days",
            "2",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
            "-subj",
            f"/CN=mpsched test {name}",
        )

    def leaf(name: str, ca: str, serial: int) -> TlsConfig:
        openssl(
            "req",
            "-new",
            *EC_KEY,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=mpsched test {name}",
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-set_serial",
            str(serial),
            "-days",
            "2",
            "-out",
            f"{name}.pem",
        )
        return TlsConfig(cert=where / f"{name}.pem", key=where / f"{name}.key")

    authority("ca")
    authority("other-ca")
    return Certs(
        ca=where / "ca.pem",
        server=leaf("server", "ca", 1),
        client=leaf("client", "ca", 2),
        other_ca=where / "other-ca.pem",
        stranger=leaf("stranger", "other-ca", 3),
    )


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., InProcessServer]]:
    """Start servers over TCP with the given TLS setting; the test then sets its own
    (client) setting. Everything is stopped and the setting cleared at the end."""
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 2.0)
    before = current_tls()
    started: list[InProcessServer] = []

    def start(config: TlsConfig | None, address: Any = ("127.0.0.1", 0)) -> InProcessServer:
        set_tls(config)
        try:
            started.append(InProcessServer(address).start())
        finally:
            set_tls(None)
        return started[-1]

    yield start
    set_tls(before)
    for running in started:
        running.stop()


def _served_by(conn: FastConnection) -> Any:
    """Ask a manager server for its methods' names over ``conn``: a full request."""
    conn.send((None, "dummy", (), {}))
    return conn.recv()


def _with_ca(certs: Certs, **more: Any) -> TlsConfig:
    return TlsConfig(ca=certs.ca, **more)


def test_a_client_with_the_ca_talks_tls_to_the_server(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    set_tls(_with_ca(certs))
    with client_connection(server.address, KEY) as conn:
        assert isinstance(conn._sock, ssl.SSLSocket)
        assert conn._sock.version() in ("TLSv1.2", "TLSv1.3")
        assert _served_by(conn) == ("#RETURN", None)
    # What multiprocessing.managers does for every proxy: it works the same way.
    manager = ServiceManager(address=server.address, authkey=KEY, serializer=SERIALIZER)
    manager.connect()


def test_a_peer_trickling_its_tls_hello_is_dropped_at_the_handshake_deadline(
    certs: Certs, serve: Callable[..., InProcessServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.5)
    # The start of a TLS record of 256 bytes, a byte every 0.1 s: 26 s in all.
    hello = b"\x16\x03\x01\x01\x00" + b"\x01" * 256
    stop = threading.Event()
    sender: threading.Thread | None = None
    with socket.create_connection(server.address) as peer:
        try:
            t0 = time.monotonic()
            sender = threading.Thread(target=trickle, args=(peer, hello, 0.1, stop), daemon=True)
            sender.start()
            assert read_until_closed(peer, timeout=60) == b""
            assert time.monotonic() - t0 < 5
        finally:
            stop.set()
            if sender is not None:
                sender.join(30)


def test_idle_tls_handshakes_cost_no_thread(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    threads_before = threading.active_count()
    hello = b"\x16\x03\x01\x01\x00" + b"\x01" * 16  # a ClientHello's first bytes
    peers: list[socket.socket] = []
    try:
        for _ in range(10):
            peers.append(socket.create_connection(server.address))
            peers[-1].sendall(hello)
        wait_for(
            lambda: server.server.handshakes.in_handshake() == 10, 30, "the server took them in"
        )
        assert threading.active_count() <= threads_before
        set_tls(_with_ca(certs))
        with client_connection(server.address, KEY) as conn:  # served meanwhile
            assert _served_by(conn) == ("#RETURN", None)
    finally:
        for peer in peers:
            peer.close()


def test_a_tls_client_over_its_address_cap_closes_the_oldest_which_hears_why_over_tls(
    certs: Certs, serve: Callable[..., InProcessServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    monkeypatch.setattr(transport, "MAX_HANDSHAKES_PER_ADDRESS", 2)
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 60.0)  # silent ones stay
    set_tls(_with_ca(certs))
    peers: list[socket.socket] = []
    try:
        # The oldest did its TLS handshake and holds its challenge; the next one is silent.
        context = ssl.create_default_context(cafile=str(certs.ca))
        context.check_hostname = False
        in_tls = context.wrap_socket(socket.create_connection(server.address))
        peers.append(in_tls)
        in_tls.settimeout(30)
        assert b"#CHALLENGE#" in in_tls.recv(4096)
        peers.append(socket.create_connection(server.address))
        wait_for(lambda: server.server.handshakes.in_handshake() == 2, 30, "both taken in")
        with client_connection(server.address, KEY) as conn:
            assert _served_by(conn) == ("#RETURN", None)
        told = read_until_closed(in_tls, timeout=30)
        assert told[4:] == (
            b"#REFUSED#its handshake was closed to make room: 2 newer ones "
            b"from 127.0.0.1 are pending (at most 2 from one address)"
        )
        # One closed before its TLS handshake is closed without a word.
        peers.append(socket.create_connection(server.address))
        wait_for(lambda: server.server.handshakes.in_handshake() == 2, 30, "taken in")
        with client_connection(server.address, KEY) as conn:
            assert _served_by(conn) == ("#RETURN", None)
        assert read_until_closed(peers[1], timeout=30) == b""
    finally:
        for peer in peers:
            peer.close()
    wait_for(lambda: server.server.handshakes.in_handshake() == 0, 30, "all slots freed")


def test_a_bare_connect_and_close_to_a_tls_server_is_logged_quietly(
    certs: Certs, serve: Callable[..., InProcessServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mpsched.transport")
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    socket.create_connection(server.address).close()
    wait_for(
        lambda: any("closed before its handshake" in r.getMessage() for r in caplog.records),
        30,
        "the close logged",
    )
    [record] = [r for r in caplog.records if r.name == "mpsched.transport"]
    assert record.levelno == logging.DEBUG


def test_the_authkey_is_still_required_under_tls(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    set_tls(_with_ca(certs))
    with pytest.raises(AuthenticationError, match="wrong authkey"):
        client_connection(server.address, b"wrong")


def test_a_client_without_tls_fails_cleanly(
    certs: Certs, serve: Callable[..., InProcessServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.5)
    with pytest.raises((ConnectionError, TimeoutError), match="does it require TLS"):
        client_connection(server.address, KEY)
    set_tls(_with_ca(certs))
    with client_connection(server.address, KEY) as conn:  # still serving
        assert _served_by(conn) == ("#RETURN", None)


def test_a_client_with_the_wrong_ca_refuses_the_server(
    certs: Certs, serve: Callable[..., InProcessServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mpsched.transport")
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key))
    set_tls(TlsConfig(ca=certs.other_ca))
    with pytest.raises(TlsError, match=f"did not verify against the CA in {certs.other_ca}"):
        client_connection(server.address, KEY)
    set_tls(None)
    server.stop()
    assert "refused a connection" in caplog.text  # and the server dropped it


def test_a_tls_client_against_a_plain_server_says_so(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    server = serve(None)
    set_tls(_with_ca(certs))
    with pytest.raises(TlsError, match="does it serve TLS"):
        client_connection(server.address, KEY)


def test_a_server_with_a_ca_requires_client_certificates_it_signed(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    server = serve(TlsConfig(cert=certs.server.cert, key=certs.server.key, ca=certs.ca))
    set_tls(_with_ca(certs))  # no client certificate
    with pytest.raises(TlsError, match="client certificate"):
        client_connection(server.address, KEY)
    set_tls(_with_ca(certs, cert=certs.stranger.cert, key=certs.stranger.key))
    with pytest.raises(TlsError):
        client_connection(server.address, KEY)
    set_tls(_with_ca(certs, cert=certs.client.cert, key=certs.client.key))
    with client_connection(server.address, KEY) as conn:
        assert _served_by(conn) == ("#RETURN", None)


def test_unix_sockets_never_use_tls(
    certs: Certs, serve: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = serve(
        TlsConfig(cert=certs.server.cert, key=certs.server.key), str(tmp_path / "m.sock")
    )
    assert server.server.listener.tls_context is None
    set_tls(_with_ca(certs))
    with client_connection(server.address, KEY) as conn:
        assert not isinstance(conn._sock, ssl.SSLSocket)
        assert _served_by(conn) == ("#RETURN", None)


# --------------------------------------------------------------------------- settings


def test_serving_tls_needs_a_certificate(certs: Certs) -> None:
    with pytest.raises(TlsError, match="needs a certificate"):
        TlsConfig(ca=certs.ca).server_context()


def test_a_tcp_listener_refuses_to_start_without_a_certificate(
    certs: Certs, serve: Callable[..., InProcessServer]
) -> None:
    with pytest.raises(TlsError, match="needs a certificate"):
        serve(TlsConfig(ca=certs.ca))


def test_files_that_do_not_load_are_named(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(TlsError, match=f"CA file {missing}"):
        TlsConfig(ca=missing).client_context()
    with pytest.raises(TlsError, match=f"certificate {missing} with key {certs.server.key}"):
        TlsConfig(cert=missing, key=certs.server.key).server_context()
    with pytest.raises(TlsError, match=f"certificate {certs.ca} with key {certs.server.key}"):
        TlsConfig(cert=certs.ca, key=certs.server.key).server_context()  # not its key


def _copy(source: Path, to: Path, mode: int) -> Path:
    to.write_bytes(source.read_bytes())
    to.chmod(mode)
    return to


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=oct)
def test_a_key_file_others_can_read_is_refused(certs: Certs, tmp_path: Path, mode: int) -> None:
    assert certs.server.key is not None
    key = _copy(certs.server.key, tmp_path / "server.key", mode)
    refused = f"TLS key file {key} is readable by others \\(mode {mode:o}\\); chmod 600 it"
    with pytest.raises(TlsError, match=refused):
        TlsConfig(cert=certs.server.cert, key=key).server_context()
    with pytest.raises(TlsError, match=refused):
        TlsConfig(ca=certs.ca, cert=certs.server.cert, key=key).client_context()
    key.chmod(0o600)
    TlsConfig(cert=certs.server.cert, key=key).server_context()
    key.chmod(0o400)
    TlsConfig(cert=certs.server.cert, key=key).server_context()


def test_a_certificate_file_that_holds_its_key_must_be_private_too(
    certs: Certs, tmp_path: Path
) -> None:
    assert certs.server.key is not None and certs.server.cert is not None
    both = tmp_path / "both.pem"
    both.write_bytes(certs.server.cert.read_bytes() + certs.server.key.read_bytes())
    both.chmod(0o644)
    with pytest.raises(
        TlsError,
        match=f"TLS certificate file {both}, which holds its key "
        f"\\(no key file\\), is readable by others",
    ):
        TlsConfig(cert=both).server_context()
    both.chmod(0o600)
    TlsConfig(cert=both).server_context()


def test_another_users_key_file_is_refused(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # we are someone else now
    with pytest.raises(
        TlsError,
        match=f"TLS key file {certs.server.key} belongs to "
        f".*uid {owner}\\)?, not to .*uid {owner + 1}",
    ):
        certs.server.server_context()


def test_set_tls_returns_the_previous_setting_and_keeps_it_on_error(
    certs: Certs, tmp_path: Path
) -> None:
    config = _with_ca(certs)
    before = set_tls(config)
    try:
        with pytest.raises(TlsError):
            set_tls(TlsConfig(ca=tmp_path / "missing.pem"))
        assert current_tls() == config
        assert set_tls(None) == config
        assert current_tls() is None
    finally:
        set_tls(before)


# --------------------------------------------------------------------- FastConnection


@pytest.fixture
def tls_pair(certs: Certs) -> Iterator[tuple[FastConnection, FastConnection]]:
    """Two FastConnections talking TLS over a socketpair."""
    left, right = socket.socketpair()
    server, client = FastConnection(left), FastConnection(right)
    context = certs.server.server_context()
    handshake = threading.Thread(
        target=server.start_tls, args=(context,), kwargs={"server_side": True}, daemon=True
    )
    handshake.start()
    client.start_tls(_with_ca(certs).client_context(), server_side=False)
    handshake.join(30)
    assert not handshake.is_alive()
    yield server, client
    server.close()
    client.close()


@pytest.mark.parametrize("size", [0, 100, 16384, 65536, 300_000, 3_000_000])
def test_fast_connection_frames_messages_over_tls(
    tls_pair: tuple[FastConnection, FastConnection], size: int
) -> None:
    server, client = tls_pair
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    sender = threading.Thread(target=client.send, args=({"payload": payload},), daemon=True)
    sender.start()
    assert server.recv() == {"payload": payload}
    sender.join(30)
    assert not sender.is_alive()


def test_fast_connection_polls_data_the_tls_layer_holds(
    tls_pair: tuple[FastConnection, FastConnection],
) -> None:
    server, client = tls_pair
    # Two messages in one write: the tail of the first and all of the second share the
    # last TLS record, so after the first is read the second waits decrypted inside the
    # ssl object, where select() cannot see it.
    first, second = b"a" * 70_000, b"b"
    frames = b"".join(len(m).to_bytes(4, "big") + m for m in (first, second))
    sender = threading.Thread(target=client._sock.sendall, args=(frames,), daemon=True)
    sender.start()
    assert server.recv_bytes() == first
    sender.join(30)
    assert server.poll(0)
    assert server.recv_bytes() == second
    assert not server.poll(0)


# ------------------------------------------------------------------ the command line


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_serve_submit_and_status_over_tls_from_the_command_line(certs: Certs, procs: Any) -> None:
    from served import serve

    server, client = certs.server, certs.client
    manager = serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--tls-cert",
        str(server.cert),
        "--tls-key",
        str(server.key),
        "--tls-ca",
        str(certs.ca),
    )  # clients must show a certificate too
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(client.cert), "--tls-key", str(client.key)]
    # A local worker of the TLS manager ran the job: it joined over TLS as well.
    done = procs.run("submit", "math:factorial", "--args", "[5]", "--wait", *manager.cli(), *tls)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "120"
    status = procs.run("status", "--json", *manager.cli(), *tls)
    assert status.returncode == 0, status.stderr
    # Without TLS both sides wait for the other's first word: after the handshake
    # deadline, one line that names TLS as the likely cause.
    plain = procs.run("status", *manager.cli())
    assert plain.returncode == 5, plain.stderr
    assert "--tls-ca" in plain.stderr and "Traceback" not in plain.stderr


def test_serve_and_worker_refuse_a_key_file_others_can_read(
    certs: Certs, procs: Any, tmp_path: Path
) -> None:
    assert certs.server.key is not None and certs.client.key is not None
    open_key = _copy(certs.server.key, tmp_path / "server.key", 0o644)
    served = procs.run(
        "serve",
        "--address",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--tls-cert",
        str(certs.server.cert),
        "--tls-key",
        str(open_key),
    )
    assert served.returncode == 3, served.stderr
    assert served.stderr == (
        f"mpsched: TLS key file {open_key} is readable by others (mode 644); chmod 600 it\n"
    )
    open_key = _copy(certs.client.key, tmp_path / "client.key", 0o640)
    joined = procs.run(
        "worker",
        "--connect",
        "127.0.0.1:1",
        "--tls-ca",
        str(certs.ca),
        "--tls-cert",
        str(certs.client.cert),
        "--tls-key",
        str(open_key),
    )
    assert joined.returncode == 3, joined.stderr
    assert joined.stderr == (
        f"mpsched: TLS key file {open_key} is readable by others (mode 640); chmod 600 it\n"
    )


def test_stress_floods_a_tls_manager_with_the_tls_options(certs: Certs, procs: Any) -> None:
    from served import serve

    server, client = certs.server, certs.client
    manager = serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--tls-cert",
        str(server.cert),
        "--tls-key",
        str(server.key),
        "--tls-ca",
        str(certs.ca),
    )  # the producers must show a certificate too
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(client.cert), "--tls-key", str(client.key)]
    flood = procs.run(
        "stress",
        *manager.cli(),
        *tls,
        "--producers",
        "2",
        "--jobs",
        "100",
        "--horizon",
        "0.2",
        timeout=120,
    )
    assert flood.returncode == 0, flood.stdout + flood.stderr
    assert flood.stdout.splitlines()[-1] == "OK: 100 jobs ran exactly once, none early"
    # Its own manager listens on a Unix socket: TLS options there are a mistake, said so.
    own = procs.run("stress", "--tls-ca", str(certs.ca), "--jobs", "10")
    assert own.returncode == 2, own.stderr
    assert own.stderr == (
        "mpsched: --tls-ca, --tls-cert and --tls-key need --connect: the "
        "manager stress starts itself listens on a Unix socket, without "
        "TLS; see python -m mpsched stress --help\n"
    )
