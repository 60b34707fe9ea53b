"""Cancelling every job of a client not started, on a Redis store, end to end: real
``serve`` processes and a real redis-server of the test's own, the client in the test
process. What a manager's worker holds prefetched is found and given back, cancelled,
unless its worker started it; a holder that does not answer holds the cancel up for
CANCEL_WAIT at most.

A holding manager here never gives back, by itself, the jobs its worker holds prefetched
(HOLDING sets PREFETCH_HOLD to an hour in its process), so that a test can cancel while
they are held, however slow the machine. Each run of a job logs itself (shared_jobs: one
O_APPEND line).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import shared_jobs
from processes import wait_for
from served import Manager, serve

from mpsched._manager.shared_cancels import CANCEL_WAIT

pytestmark = pytest.mark.slow

HOLDING = """
import sys
from mpsched._manager import shared_prefetch
shared_prefetch.PREFETCH_HOLD = 3600.0  # its worker's prefetched jobs stay with it
from mpsched._cli.main import main
raise SystemExit(main(["serve", *sys.argv[1:]]))
"""
BATCH = 8  # the first job and the 7 a worker whose last job was short may hold beyond it
MORE = 3  # jobs of the client left pending behind the batch


def start_manager(procs: Any, url: str, *, workers: int, holding: bool = False) -> Manager:
    # max_pending: a map() goes to the manager in one call, so its jobs are pending
    # together and the idle worker claims them as one batch.
    return serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        str(workers),
        "--store",
        url,
        "--max-pending",
        "10000",
        code=HOLDING if holding else None,
    )


class HeldBatch:
    """A client whose jobs were mapped at once to a holder's idle worker: it started the
    first ("first", which waits for ``gate``) and holds the next ``count`` ("p1" ...)
    prefetched; the rest are pending."""

    def __init__(self, client: Any, holder: Manager, tmp_path: Path) -> None:
        self.client = client
        self.log = str(tmp_path / "runs.log")
        self.gate = tmp_path / "gate"
        for n in range(3):  # its worker's last job was short: it asks for company
            assert client.submit(shared_jobs.gated, self.log, f"warm{n}").result(30) == f"warm{n}"
        before = holder.stats().queue.prefetched
        self.keys = ["first"] + [f"p{n}" for n in range(1, BATCH + MORE)]
        self.results = client.map(
            shared_jobs.gated,
            [self.log] * len(self.keys),
            self.keys,
            [str(self.gate)] + [""] * (len(self.keys) - 1),
        )
        wait_for(lambda: "first" in self.ran(), 30, "the first job started")
        self.count = holder.stats().queue.prefetched - before
        assert 1 <= self.count <= BATCH - 1
        assert self.ran() == ["warm0", "warm1", "warm2", "first"]

    def ran(self) -> list[str]:
        return [r.key for r in shared_jobs.runs(self.log)]


@pytest.fixture
def stopped(procs: Any) -> Iterator[Callable[[Manager], None]]:
    """SIGSTOP a manager (not its workers); every one stopped is resumed at the end."""
    paused: list[int] = []

    def stop(manager: Manager) -> None:
        os.kill(manager.proc.pid, signal.SIGSTOP)
        paused.append(manager.proc.pid)

    yield stop
    for pid in paused:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("through", ["another-manager", "the-holder"])
def test_shutdown_cancel_futures_cancels_the_jobs_a_worker_holds_prefetched_not_started(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path, through: str
) -> None:
    holder = start_manager(procs, redis_url, workers=1, holding=True)
    front = holder if through == "the-holder" else start_manager(procs, redis_url, workers=0)
    held = HeldBatch(connect_client(front), holder, tmp_path)
    held.client.shutdown(wait=False, cancel_futures=True)
    held.gate.touch()
    assert next(held.results) == "first"  # started before the cancel: it runs to its end
    with pytest.raises(concurrent.futures.CancelledError):
        next(held.results)  # p1: prefetched, not started
    wait_for(lambda: holder.stats().queue.in_flight == 0, 30, "the holder ran dry")
    states = {info.job_id: info.state for info in connect_client(front).jobs()}
    assert list(states.values()).count("cancelled") == len(held.keys) - 1
    assert held.ran() == ["warm0", "warm1", "warm2", "first"]  # none of them ever ran


def test_a_holder_that_does_not_answer_holds_the_cancel_up_no_longer_than_its_bound(
    procs: Any,
    connect_client: Callable[..., Any],
    redis_url: str,
    tmp_path: Path,
    stopped: Callable[[Manager], None],
) -> None:
    holder = start_manager(procs, redis_url, workers=1, holding=True)
    front = start_manager(procs, redis_url, workers=0)
    held = HeldBatch(connect_client(front), holder, tmp_path)
    stopped(holder)
    started = time.monotonic()
    held.client.shutdown(wait=False, cancel_futures=True)
    assert time.monotonic() - started < CANCEL_WAIT + 3.0
    os.kill(holder.proc.pid, signal.SIGCONT)
    held.gate.touch()
    # Its prefetched jobs were not cancelled: they run, each once; the pending ones did not.
    ran = held.keys[: 1 + held.count]
    assert [next(held.results) for _ in ran] == ran
    with pytest.raises(concurrent.futures.CancelledError):
        next(held.results)
    assert held.ran() == ["warm0", "warm1", "warm2", *ran]
