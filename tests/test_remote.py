"""``worker --connect`` pools end to end: another clock, a pool that keeps its size, and a
manager that goes away and comes back. Real ``serve`` and ``worker`` processes, started
and killed (by pid or by their own process group) through test_cli's helpers.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import jobs
import psutil
import pytest
from processes import wait_for
from test_cli import START_TIMEOUT, Manager, Proc, Processes, pool_workers, serve

import mpsched
from mpsched._protocol import Exit

pytestmark = pytest.mark.slow

# Makes a process's monotonic clock read ``offset`` seconds off, as on a machine (or a VM,
# or a container in its own time namespace) that booted at another time. Put on a worker's
# PYTHONPATH, Python runs it at start-up, before mpsched is imported.
OFFSET_CLOCK = """
import time

_monotonic, _monotonic_ns = time.monotonic, time.monotonic_ns
time.monotonic = lambda: _monotonic() + {offset!r}
time.monotonic_ns = lambda: _monotonic_ns() + {offset_ns!r}
"""


def start_pool(procs: Processes, manager: Manager, processes: int, *options: str,
               env: dict[str, str] | None = None) -> Proc:
    pool = procs.start("worker", *manager.cli(), "--processes", str(processes),
                       "--heartbeat-interval", "0.5", *options, env=env)
    assert f"{processes} process{'es' if processes > 1 else ''} joined" in pool.line()
    wait_for(lambda: len(pool_workers(manager, pool)) == processes, START_TIMEOUT,
             "the pool's workers joined")
    return pool


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "authkey"
    path.write_bytes(os.urandom(16).hex().encode())
    path.chmod(0o600)
    return path


# ------------------------------------------------------------------------------ clocks


@pytest.mark.parametrize("offset", [3600.0, -3600.0], ids=["clock-ahead", "clock-behind"])
def test_a_remote_worker_with_another_monotonic_clock_runs_jobs_on_time(
        procs: Processes, connect_client: Callable[[Manager], mpsched.Client],
        tmp_path: Path, offset: float) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        OFFSET_CLOCK.format(offset=offset, offset_ns=int(offset * 1e9)))
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    # Same host name, same machine: only its clock differs.
    pythonpath = os.pathsep.join([str(site), procs.env["PYTHONPATH"]])
    start_pool(procs, manager, 1, env={"PYTHONPATH": pythonpath})
    client = connect_client(manager)

    submitted = time.time()
    their_clock = client.submit(time.monotonic).result(timeout=10)
    ran_at = client.submit(time.time).result(timeout=10)
    assert abs(their_clock - time.monotonic() - offset) < 60, "the offset clock is not on"
    assert ran_at - submitted < 1.0  # due now: ran at once, not in an hour

    # Wall-clock due time: exact on the manager's side (same machine, same wall clock).
    due = time.time() + 2
    started = client.schedule(time.time, at=due).result(timeout=30)
    # 1 ms: the manager converts `at` to its monotonic clock through the wall clock.
    assert started >= due - 0.001, f"started {due - started:.4f} s early"
    assert started <= due + 0.05, f"started {started - due:.4f} s late"
    # Its start stamps are on its own clock: they say nothing about lateness here.
    queue = manager.stats().queue
    assert queue.completed == 3 and queue.lateness_samples == 0 and queue.started_early == 0


# ------------------------------------------------------------------------------ pool size


@pytest.mark.parametrize("code", [0, int(Exit.AUTH)], ids=["exit-0", "exit-3-like-auth"])
def test_a_job_that_ends_its_worker_process_is_replaced_whatever_the_exit_code(
        procs: Processes, connect_client: Callable[[Manager], mpsched.Client],
        code: int) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0",
                    "--heartbeat-timeout", "2")
    pool = start_pool(procs, manager, 2)
    before = {w.pid for w in pool_workers(manager, pool)}
    client = connect_client(manager)
    doomed = client.submit(os._exit, code)
    assert isinstance(doomed.exception(timeout=30), mpsched.WorkerCrashedError)
    wait_for(lambda: len(pool_workers(manager, pool)) == 2, START_TIMEOUT,
             "the pool is back to 2 workers")
    after = {w.pid for w in pool_workers(manager, pool)}
    assert len(after - before) == 1
    assert pool.popen.poll() is None, pool.stderr()
    assert client.submit(jobs.pid).result(timeout=30) in after


# ------------------------------------------------------------------------------ the manager


def test_a_remote_pool_waits_for_its_manager_to_come_back(
        procs: Processes, connect_client: Callable[[Manager], mpsched.Client],
        tmp_path: Path) -> None:
    # The same address and key: a manager restarted in place.
    where = ("--address", f"127.0.0.1:{free_port()}", "--workers", "0",
             "--authkey-file", str(key_file(tmp_path)))
    first = serve(procs, *where)
    pool = start_pool(procs, first, 2, "--log-level", "info")
    doomed, survivor = (w.pid for w in pool_workers(first, pool))

    os.kill(first.proc.pid, signal.SIGKILL)  # gone without a word
    first.proc.wait()
    wait_for(lambda: pool.stderr().count("lost its manager") == 2, 30,
             "both workers noticed")
    # A worker that dies during the outage is replaced by one that waits too.
    psutil.Process(doomed).kill()
    wait_for(lambda: "starting another" in pool.stderr(), 30, "the pool replaced it")
    assert pool.popen.poll() is None, pool.stderr()

    second = serve(procs, *where)
    wait_for(lambda: len(pool_workers(second, pool)) == 2, 30, "the pool joined again")
    pids = {w.pid for w in pool_workers(second, pool)}
    assert survivor in pids and doomed not in pids
    client = connect_client(second)
    assert client.submit(jobs.pid).result(timeout=30) in pids
    log = pool.stderr()
    assert log.count("lost its manager") == 2  # one warning per worker and outage
    assert log.count("no manager answers") == 1  # the replacement's, at its first join
    assert log.count("reconnected to the manager") == 2
    assert "Traceback" not in log


def test_a_remote_pool_exits_0_and_says_so_when_its_manager_stops(procs: Processes) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    pool = start_pool(procs, manager, 2)
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    assert pool.wait() == Exit.OK, pool.stderr()
    assert pool.stderr().count(f"the manager at {manager.address} stopped") == 1


def test_a_pool_with_no_manager_at_its_address_fails_fast(
        procs: Processes, tmp_path: Path) -> None:
    t0 = time.monotonic()
    nobody = procs.run("worker", "--connect", f"127.0.0.1:{free_port()}",
                       "--authkey-file", str(key_file(tmp_path)), timeout=30)
    assert nobody.returncode == Exit.UNREACHABLE, nobody.stderr
    assert "no manager answers" in nobody.stderr
    assert time.monotonic() - t0 < 15
