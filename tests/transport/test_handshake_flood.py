"""A real ``serve`` under a flood of idle connections, from other hosts or from the clients'
own address: workers still join, clients still connect and run jobs, scrapes still get
their metrics."""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from idle_peers import read_status
from processes import wait_for
from served import Manager, Processes, pool_workers, serve, start_pool

import mpsched
from mpsched._transport.address import parse_address
from mpsched._transport.connect import HANDSHAKE_TIMEOUT
from mpsched._transport.sockets import MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS

pytestmark = pytest.mark.slow

# Four hosts, each past its cap, together at MAX_HANDSHAKES; clients come from 127.0.0.1.
SOURCES = [f"127.0.0.{i}" for i in range(2, 2 + MAX_HANDSHAKES // MAX_HANDSHAKES_PER_ADDRESS)]
PER_SOURCE = MAX_HANDSHAKES_PER_ADDRESS + 22  # 600 idle sockets in all
CONNECT_BOUND = 30.0  # s for one connect(): a hang, not a slow machine, exceeds it


def test_idle_sockets_from_several_hosts_keep_no_client_or_worker_out(
    procs: Processes, connect_client: Callable[..., mpsched.Client], tmp_path: Path
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    address = parse_address(manager.address)
    assert isinstance(address, tuple)  # a TCP one
    host, port = address
    status = tmp_path / "flood.json"
    procs.start(
        "-c",
        "import idle_peers; idle_peers.main()",
        host,
        str(port),
        ",".join(SOURCES),
        str(PER_SOURCE),
        str(status),
    )
    # Each host holds all the handshake slots it may have; each of its other sockets closes
    # its oldest and is closed in turn by the next, and reopened, again and again.
    held = len(SOURCES) * MAX_HANDSHAKES_PER_ADDRESS
    wait_for(
        lambda: read_status(status)["holding"] >= held and read_status(status)["refused"] > 0,
        60,
        "the flood holds its slots",
    )
    pool = start_pool(procs, manager, processes=2)  # both workers connected
    # For longer than a handshake deadline: the flood's sockets are dropped at their
    # deadline and reopened meanwhile.
    until = time.monotonic() + 2 * HANDSHAKE_TIMEOUT
    rounds = 0
    while time.monotonic() < until or rounds < 3:
        started = time.monotonic()
        client = connect_client(manager)
        assert time.monotonic() - started < CONNECT_BOUND
        futures = [client.submit(math.factorial, n) for n in range(10)]
        assert [f.result(timeout=60) for f in futures] == [math.factorial(n) for n in range(10)]
        client.shutdown()
        submitted = procs.run("submit", "math:factorial", "--args", "[6]", "--wait", *manager.cli())
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.split()[-1] == "720"
        rounds += 1
    assert read_status(status)["dropped"] >= held  # every slot changed hands...
    wait_for(
        lambda: read_status(status)["holding"] >= held, 30, "the flood took its slots again"
    )  # ...and was taken again
    assert len({w.pid for w in manager.remote_workers()}) == 2
    assert pool.popen.poll() is None


FLOOD = 500  # idle sockets held, from the clients' own address
ROUNDS_FOR = 2 * HANDSHAKE_TIMEOUT  # s: the flood's sockets turn over meanwhile


def _scrape(url: str) -> int:
    """One Prometheus-like scrape: a connection of its own, no retry."""
    with urllib.request.urlopen(url + "metrics", timeout=CONNECT_BOUND) as answer:
        assert b"mpsched_workers" in answer.read()
        return int(answer.status)


def _client_round(
    connect_client: Callable[..., mpsched.Client], manager: Manager, n: int
) -> list[int]:
    started = time.monotonic()
    client = connect_client(manager)
    assert time.monotonic() - started < CONNECT_BOUND
    try:
        futures = [client.submit(math.factorial, n + i) for i in range(3)]
        return [f.result(timeout=60) for f in futures]
    finally:
        client.shutdown()


def test_idle_sockets_from_the_clients_own_address_keep_nobody_out(
    procs: Processes, connect_client: Callable[..., mpsched.Client], tmp_path: Path
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--http", "127.0.0.1:0")
    page = next(line for line in (manager.proc.line() for _ in range(3)) if "page:" in line)
    found = re.search(r"page:\s+(http://127\.0\.0\.1:(\d+)/)", page)
    assert found, page
    url, http_port = found.group(1), int(found.group(2))
    address = parse_address(manager.address)
    assert isinstance(address, tuple)  # a TCP one
    host, port = address
    flood, http_flood = tmp_path / "flood.json", tmp_path / "http-flood.json"
    for target, status in ((port, flood), (http_port, http_flood)):
        procs.start(
            "-c",
            "import idle_peers; idle_peers.main()",
            host,
            str(target),
            "127.0.0.1",
            str(FLOOD),
            str(status),
        )
    # More idle sockets than the caps: the manager holds what it may, the rest come again.
    wait_for(
        lambda: (
            read_status(flood)["holding"] >= MAX_HANDSHAKES_PER_ADDRESS
            and read_status(http_flood)["closed"] > FLOOD
        ),
        60,
        "the floods hold their slots",
    )
    closed_before = read_status(flood)["closed"]
    pool = start_pool(procs, manager, processes=2)  # started under the flood
    wait_for(lambda: len(pool_workers(manager, pool)) == 2, 60, "both workers joined")
    until = time.monotonic() + ROUNDS_FOR
    rounds = 0
    with ThreadPoolExecutor(max_workers=5) as clients:
        while time.monotonic() < until or rounds < 3:
            results = [clients.submit(_client_round, connect_client, manager, n) for n in range(5)]
            assert _scrape(url) == 200
            assert [r.result(timeout=120) for r in results] == [
                [math.factorial(n + i) for i in range(3)] for n in range(5)
            ]
            rounds += 1
    assert read_status(flood)["closed"] > closed_before + FLOOD  # it went on all along
    assert pool.popen.poll() is None
    assert len(pool_workers(manager, pool)) == 2
