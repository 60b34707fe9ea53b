"""WorkerPool's own bookkeeping, without processes: a worker process that dies while it is
being started (mpsched._worker.pool)."""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mpsched._worker.pool import RESTART_BACKOFF, WorkerPool
from mpsched._worker.process import WorkerConfig


class DiesAsItStarts:
    """A process whose start finds the pipe to it closed: forkserver's start writes what
    the child runs into a pipe, and a child killed as it was forked has closed its end."""

    def __init__(self, **kwargs: Any) -> None:
        self.pid = None

    def start(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    config = WorkerConfig(address=str(tmp_path / "no-manager.sock"), authkey=b"k", worker_id="")
    pool = WorkerPool(config, 1, "spawn")
    real = multiprocessing.get_context("spawn")
    pool._ctx = SimpleNamespace(
        RawValue=real.RawValue,
        RawArray=real.RawArray,
        Lock=real.Lock,
        Pipe=real.Pipe,
        Process=DiesAsItStarts,
    )
    yield pool
    pool._slots.close()
    pool._lifeline_r.close()
    pool._lifeline_w.close()
    os.close(pool._wake_r)
    os.close(pool._wake_w)


def test_a_worker_that_dies_while_it_is_started_is_started_again_after_the_back_off(
    pool: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mpsched.remote")
    pool._start(patient=False)  # it does not raise: the pool goes on
    assert pool._workers == [] and pool._missing == 1
    delay = pool._start_delay()
    assert delay is not None and 0 < delay <= RESTART_BACKOFF[0]
    pool._missing = 0
    pool._start(patient=True)  # a second one in the streak: twice the wait, no new warning
    delay = pool._start_delay()
    assert delay is not None and RESTART_BACKOFF[0] < delay <= 2 * RESTART_BACKOFF[0]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "died as it started (broken pipe) before it joined" in warned[0], (
        warned
    )
