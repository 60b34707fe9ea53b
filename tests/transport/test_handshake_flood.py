"""A real ``serve`` under a flood of idle connections: workers still join and clients still
connect and run jobs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from idle_peers import read_status
from processes import wait_for
from served import Processes, serve, start_pool

import mpsched
from mpsched._transport.address import parse_address
from mpsched._transport.connect import HANDSHAKE_TIMEOUT
from mpsched._transport.sockets import MAX_HANDSHAKES_PER_ADDRESS

pytestmark = pytest.mark.slow

SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]  # ten hosts; clients come from 127.0.0.1
PER_SOURCE = 50  # 500 idle sockets in all
CONNECT_BOUND = 30.0  # s for one connect(): a hang, not a slow machine, exceeds it


def test_idle_sockets_from_several_hosts_keep_no_client_or_worker_out(
        procs: Processes, connect_client: Callable[..., mpsched.Client],
        tmp_path: Path) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    host, port = parse_address(manager.address)
    status = tmp_path / "flood.json"
    procs.start("-c", "import idle_peers; idle_peers.main()", host, str(port),
                ",".join(SOURCES), str(PER_SOURCE), str(status))
    # Each host holds all the handshake slots it may have; the rest of its sockets are
    # turned away and reopened, again and again.
    held = len(SOURCES) * MAX_HANDSHAKES_PER_ADDRESS
    wait_for(lambda: read_status(status)["holding"] >= held
             and read_status(status)["refused"] > 0, 60, "the flood holds its slots")
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
        assert [f.result(timeout=60) for f in futures] == [math.factorial(n)
                                                            for n in range(10)]
        client.shutdown()
        submitted = procs.run("submit", "math:factorial", "--args", "[6]", "--wait",
                              *manager.cli())
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.split()[-1] == "720"
        rounds += 1
    assert read_status(status)["dropped"] >= held  # every slot changed hands...
    wait_for(lambda: read_status(status)["holding"] >= held, 30,
             "the flood took its slots again")  # ...and was taken again
    assert len({w.pid for w in manager.remote_workers()}) == 2
    assert pool.popen.poll() is None
