"""Remote workers' jobs outlive a SIGKILL of their manager, and of their pool: the worker
(or the next pool) tells the manager what its claim slot says, so a job that ran to its
end ends done, once, and is never taken for a crashed one."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import jobs
import pytest
from processes import wait_for, wait_started
from served import START_TIMEOUT, Manager, Processes, serve, start_pool
from worker.test_remote import free_port, key_file

import mpsched
from mpsched._worker.slot_file import read_traces

pytestmark = pytest.mark.slow

SILENT_FOR = "120"  # heartbeat timeout: a job resolved sooner was resolved by a worker's word


def kill_group(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)


def test_a_job_a_remote_worker_runs_through_a_sigkill_of_its_manager_ends_done_once(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path, fifo: str
) -> None:
    store, release = tmp_path / "jobs.db", tmp_path / "release"
    where = (
        "--store",
        str(store),
        "--address",
        f"127.0.0.1:{free_port()}",
        "--workers",
        "0",
        "--authkey-file",
        str(key_file(tmp_path)),
        "--heartbeat-timeout",
        SILENT_FOR,
    )
    manager = serve(procs, *where)
    pool = start_pool(procs, manager, 1)
    client = connect_client(manager)
    future = client.submit(jobs.announce_then_wait, fifo, str(release), 60)  # retries=0
    [ran_in] = wait_started(fifo)
    kill_group(manager.proc.pid)  # the manager dies; its remote worker runs on
    manager.proc.wait()
    manager = serve(procs, *where)
    banner = [manager.proc.line() for _ in range(3)]  # status, store, what came back
    assert "1 wait for their remote worker to say how they ended" in banner[2], banner
    release.touch()  # the job ends now, under a manager that did not hand it out
    assert future.result(timeout=START_TIMEOUT) == "woke"
    assert ran_in in {p.pid for p in pool.descendants()}  # the same process: run once
    shown = connect_client(manager).job_info(future.job_id)
    assert shown.state == "done" and shown.attempts == 1


def test_a_job_a_remote_worker_ran_to_its_end_survives_a_sigkill_of_its_pool(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path, fifo: str
) -> None:
    # The job ends while its manager is stopped, so its report cannot get there; then the
    # pool is SIGKILLed with its worker. The next pool finds the slot file, and tells.
    release = tmp_path / "release"
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", SILENT_FOR
    )
    pool = start_pool(procs, manager, 1)
    client = connect_client(manager)
    future = client.submit(jobs.announce_then_wait, fifo, str(release), 60)
    wait_started(fifo)
    os.kill(manager.proc.pid, signal.SIGSTOP)
    try:
        release.touch()
        [slots] = (procs.runtime_dir / "mpsched").glob("pool-*.workers")

        def kept() -> bool:
            return any(
                r.outcome.job_id == future.job_id
                for left in read_traces(str(slots)).values()
                for r in left.ended
            )

        try:
            wait_for(kept, START_TIMEOUT, "the worker kept its report")
        except AssertionError as exc:  # what the slot says, and what the pool said
            raise AssertionError(
                f"{exc}; slots: {read_traces(str(slots))}; pool's stderr:\n{pool.stderr()}"
            ) from None
        kill_group(pool.pid)
        pool.popen.wait()
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
    start_pool(procs, manager, 1)
    assert future.result(timeout=START_TIMEOUT) == "woke"  # not WorkerCrashedError
    wait_for(lambda: not slots.exists(), START_TIMEOUT, "the dead pool's file removed")
