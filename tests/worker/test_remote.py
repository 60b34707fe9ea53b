"""``worker --connect`` pools end to end: another clock, a pool that keeps its size, deaths
the manager hears of at once, workers that die at start, and a manager that goes away and
comes back. Real ``serve`` and ``worker`` processes, started
and killed (by pid or by their own process group) through tests/served.py.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import psutil
import pytest
from processes import assert_gone, wait_for, wait_started
from served import START_TIMEOUT, Manager, Proc, Processes, pool_workers, serve
from servers import unanswered_address

import mpsched
from mpsched._protocol.records import (
    Exit,
)

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


def start_pool(
    procs: Processes,
    manager: Manager,
    processes: int,
    *options: str,
    env: dict[str, str] | None = None,
) -> Proc:
    pool = procs.start(
        "worker",
        *manager.cli(),
        "--processes",
        str(processes),
        "--heartbeat-interval",
        "0.5",
        *options,
        env=env,
    )
    assert f"{processes} process{'es' if processes > 1 else ''} joined" in pool.line()
    wait_for(
        lambda: len(pool_workers(manager, pool)) == processes,
        START_TIMEOUT,
        "the pool's workers joined",
    )
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
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    offset: float,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        OFFSET_CLOCK.format(offset=offset, offset_ns=int(offset * 1e9))
    )
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
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], code: int
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "2")
    pool = start_pool(procs, manager, 2)
    before = {w.pid for w in pool_workers(manager, pool)}
    client = connect_client(manager)
    doomed: mpsched.JobFuture[Any] = client.submit(os._exit, code)  # NoReturn
    assert isinstance(doomed.exception(timeout=30), mpsched.WorkerCrashedError)
    wait_for(
        lambda: len(pool_workers(manager, pool)) == 2,
        START_TIMEOUT,
        "the pool is back to 2 workers",
    )
    after = {w.pid for w in pool_workers(manager, pool)}
    assert len(after - before) == 1
    assert pool.popen.poll() is None, pool.stderr()
    assert client.submit(jobs.pid).result(timeout=30) in after


# ------------------------------------------------------------------------------ deaths

# Long enough that a job failed within it was failed by the pool's word, not by silence.
SILENT_FOR = "120"
CRASH_SEEN = 30.0  # seconds within which the job of a dead remote worker must be resolved


@pytest.mark.parametrize("how", ["exit-3", "sigkill"])
def test_a_remote_worker_that_dies_fails_its_job_at_once_naming_the_exit(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], fifo: str, how: str
) -> None:
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", SILENT_FOR
    )
    pool = start_pool(procs, manager, 1)
    client = connect_client(manager)
    doomed: mpsched.JobFuture[object]
    if how == "exit-3":
        doomed = client.submit(jobs.exit_process, 3)
    else:
        doomed = client.submit(jobs.announce_then_sleep, fifo, 300)
        [pid] = wait_started(fifo)
        os.kill(pid, signal.SIGKILL)
    error = doomed.exception(timeout=CRASH_SEEN)
    assert isinstance(error, mpsched.WorkerCrashedError), error
    if how == "exit-3":
        assert error.exitcode == 3 and "exited with code 3" in str(error), error
    else:
        assert error.exitcode == -signal.SIGKILL and "signal SIGKILL" in str(error), error
    # Its replacement runs the next job.
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "a replacement")
    assert client.submit(jobs.pid).result(timeout=30) in {
        w.pid for w in pool_workers(manager, pool)
    }
    assert "missed its heartbeats" not in manager.proc.stderr()


def test_a_death_the_manager_cannot_be_told_of_is_found_by_the_missed_heartbeats(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "3")
    pool = start_pool(procs, manager, 1)
    client = connect_client(manager)
    doomed = client.submit(jobs.announce_then_sleep, fifo, 300)
    [pid] = wait_started(fifo)
    os.kill(manager.proc.pid, signal.SIGSTOP)  # it takes connections, and answers none
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: "could not tell the manager" in pool.stderr(), 30, "the pool gave up telling it"
        )
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
    error = doomed.exception(timeout=CRASH_SEEN)
    assert isinstance(error, mpsched.WorkerCrashedError), error
    assert error.exitcode is None and "went away" in str(error), error
    # Said once the jobs it held are resolved (the count is in the line): right after.
    wait_for(
        lambda: "missed its heartbeats" in manager.proc.stderr(),
        10,
        "the manager said why the worker was declared gone",
    )


def test_a_job_whose_remote_worker_died_runs_again_at_once_if_its_retries_allow(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path
) -> None:
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", SILENT_FOR
    )
    start_pool(procs, manager, 1)
    client = connect_client(manager)
    again = client.schedule(jobs.die_once, str(tmp_path / "died"), retries=1)
    assert again.result(timeout=CRASH_SEEN) == "survived"
    assert manager.stats().queue.retried == 1


# Kills every process forked from the process it runs in (a pool's forkserver) at once,
# before it can join, while the file ``healed`` does not exist; each death appends its
# time (the system-wide monotonic clock) to ``forks``. Put on a pool's PYTHONPATH, Python
# runs it at start-up; the pool itself never forks.
DIE_AT_START = """
import itertools
import os
import time


def _die_unless_healed():
    if not os.path.exists({healed!r}):
        with open({forks!r}, "a") as log:
            log.write(f"{{time.monotonic()}}\\n")
        os._exit(7)


os.register_at_fork(after_in_child=_die_unless_healed)
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_pool_whose_workers_die_at_start_backs_off_and_warns_once_a_streak(
    procs: Processes, tmp_path: Path
) -> None:
    site, forks, healed = tmp_path / "site", tmp_path / "forks", tmp_path / "healed"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        DIE_AT_START.format(healed=str(healed), forks=str(forks))
    )
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    pythonpath = os.pathsep.join([str(site), procs.env["PYTHONPATH"]])
    pool = procs.start(
        "worker",
        *manager.cli(),
        "--processes",
        "1",
        "--log-level",
        "info",
        env={"PYTHONPATH": pythonpath},
    )
    wait_for(lambda: len(_lines(forks)) >= 6, 60, "six workers died at start")
    died = [float(line) for line in _lines(forks)[:6]]
    gaps = [later - earlier for earlier, later in itertools.pairwise(died)]
    for gap, backoff in zip(gaps, [0.1, 0.2, 0.4, 0.8, 1.6], strict=True):
        assert gap >= backoff - 0.001, gaps  # each start waited out its back-off
    log = pool.stderr()
    assert log.count("before it joined the manager") == 1, log
    # A child killed as it is forked exits 7; or, if it died before the pool's start of it
    # returned, that start found its pipe closed (tests/worker/test_pool.py).
    assert re.search(
        r"(exited with 7|died as it started \(broken pipe\)) before it joined "
        r"the manager; starting another in 0\.1 s",
        log,
    ), log
    assert pool.popen.poll() is None, log

    healed.touch()
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "one joined")
    wait_for(lambda: "joined the manager after" in pool.stderr(), 30, "the streak ended")
    # A new streak starts from the first back-off, and is warned of again.
    healed.unlink()
    [joined] = pool_workers(manager, pool)
    before = len(_lines(forks))
    os.kill(joined.pid, signal.SIGKILL)
    wait_for(lambda: len(_lines(forks)) >= before + 2, 60, "two more died at start")
    first, second = (float(line) for line in _lines(forks)[before : before + 2])
    assert 0.1 - 0.001 <= second - first < 3.0  # not the 6.4 s or more the streak had reached
    log = pool.stderr()
    assert log.count("before it joined the manager; starting another in 0.1 s") == 2, log
    assert "Traceback" not in log


# ------------------------------------------------------------------------------ the manager


def test_a_remote_pool_waits_for_its_manager_to_come_back(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path
) -> None:
    # The same address and key: a manager restarted in place.
    where = (
        "--address",
        f"127.0.0.1:{free_port()}",
        "--workers",
        "0",
        "--authkey-file",
        str(key_file(tmp_path)),
    )
    first = serve(procs, *where)
    pool = start_pool(procs, first, 2, "--log-level", "info")
    doomed, survivor = (w.pid for w in pool_workers(first, pool))

    os.kill(first.proc.pid, signal.SIGKILL)  # gone without a word
    first.proc.wait()
    wait_for(lambda: pool.stderr().count("lost its manager") == 2, 30, "both workers noticed")
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


def test_an_idle_worker_that_loses_its_manager_says_no_finished_job_is_lost(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client]
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    pool = start_pool(procs, manager, 1)
    client = connect_client(manager)
    done = client.submit(jobs.pid)
    done.result(timeout=30)  # its report reached the manager: the outcome came back
    # Within the worker's next long poll (5 s): it has nothing left to report.
    os.kill(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()
    wait_for(lambda: "lost its manager" in pool.stderr(), 30, "the worker noticed")
    log = pool.stderr()
    assert done.job_id not in log and "is lost" not in log, log


RESTARTED_BOUND = 10.0  # s from a restarted manager's banner to a job its old pool ran


def test_a_remote_pool_rides_out_its_manager_stopped_and_started_again(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path
) -> None:
    # As a deploy restarts a service: SIGTERM, then serve again at the same address and key.
    where = (
        "--address",
        f"127.0.0.1:{free_port()}",
        "--workers",
        "0",
        "--authkey-file",
        str(key_file(tmp_path)),
    )
    manager = serve(procs, *where)
    pool = start_pool(procs, manager, 2)
    for restart in (1, 2):
        os.kill(manager.proc.pid, signal.SIGTERM)
        assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
        manager = serve(procs, *where)
        restarted = time.monotonic()
        ran_on = connect_client(manager).submit(jobs.pid).result(timeout=RESTARTED_BOUND)
        assert time.monotonic() - restarted < RESTARTED_BOUND, restart
        assert pool.popen.poll() is None, pool.stderr()  # the same pool, still running
        assert ran_on in {p.pid for p in pool.descendants()}
    log = pool.stderr()
    # Each stop is heard as one (or, between two calls, as a lost connection).
    assert "stopped; joining it again once it is back" in log
    assert "dismissed" not in log and "Traceback" not in log


def test_a_remote_pool_exits_0_when_its_manager_stops_draining_its_workers(
    procs: Processes,
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--drain-workers-on-stop")
    pool = start_pool(procs, manager, 2)
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    assert pool.wait() == Exit.OK, pool.stderr()
    assert pool.stderr().count(f"the manager at {manager.address} dismissed this pool") == 1


def test_drain_workers_lets_the_running_job_finish_and_the_pool_exit_0(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], fifo: str
) -> None:
    # A long heartbeat timeout: only a proper leave removes the workers in time.
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "60"
    )
    pool = start_pool(procs, manager, 2)
    children = procs.note_descendants(pool)
    client = connect_client(manager)
    running = client.submit(jobs.announce_then_sleep, fifo, 3.0)
    wait_started(fifo)
    drained = procs.run("drain-workers", *manager.cli())
    assert drained.returncode == Exit.OK, drained.stderr
    assert drained.stdout.startswith(
        f"told 2 remote workers of the manager at {manager.address} to leave"
    ), drained.stdout
    assert running.result(timeout=30) == "woke"  # it ran to its end
    assert pool.wait() == Exit.OK, pool.stderr()
    assert_gone(children)
    wait_for(lambda: not manager.stats().workers, 5, "the pool's workers left")
    assert manager.stats().queue.failed == 0
    # The manager goes on: a pool started later joins it as usual.
    later = start_pool(procs, manager, 1)
    assert client.submit(jobs.pid).result(timeout=30) in {p.pid for p in later.descendants()}


def test_a_pool_with_no_manager_at_its_address_fails_fast(procs: Processes, tmp_path: Path) -> None:
    t0 = time.monotonic()
    nobody = procs.run(
        "worker",
        "--connect",
        f"127.0.0.1:{free_port()}",
        "--authkey-file",
        str(key_file(tmp_path)),
        timeout=30,
    )
    assert nobody.returncode == Exit.UNREACHABLE, nobody.stderr
    assert "no manager answers" in nobody.stderr
    assert time.monotonic() - t0 < 15


def test_a_pool_whose_manager_never_answers_the_connect_times_out(
    procs: Processes, tmp_path: Path
) -> None:
    with unanswered_address() as (host, port):
        t0 = time.monotonic()
        silent = procs.run(
            "worker",
            "--connect",
            f"{host}:{port}",
            "--authkey-file",
            str(key_file(tmp_path)),
            timeout=60,
        )
        took = time.monotonic() - t0
    assert silent.returncode == Exit.UNREACHABLE, silent.stderr
    assert silent.stderr == (
        f"mpsched: no manager answers at {host}:{port}: cannot reach "
        f"the host (timed out connecting after 10 s)\n"
    )
    assert 10 <= took < 50  # CONNECT_TIMEOUT, not the kernel's two minutes of retries
