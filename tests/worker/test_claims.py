"""A local worker's claim slot as a fence: it starts no job whose lease its manager
cannot prove current (mpsched._manager.shared_fence), in this process."""

from __future__ import annotations

import multiprocessing
import threading
import time

from mpsched._worker.claims import ClaimSlot, LocalClaims

SECOND = 1_000_000_000  # nanoseconds


def slot() -> ClaimSlot:
    return ClaimSlot(multiprocessing.get_context("spawn"))


def test_a_slot_without_a_fence_lets_every_job_start() -> None:
    assert slot().may_start(1, wait=0.0)


def test_a_job_below_the_taken_back_mark_never_starts() -> None:
    claims = LocalClaims()
    fenced = slot()
    claims.add("w1", fenced)
    claims.set_fence(time.monotonic_ns() + 60 * SECOND, 5)
    assert not fenced.may_start(4, wait=0.0)
    assert fenced.may_start(5, wait=0.0)
    later = slot()
    claims.add("w2", later)  # a worker started later gets the fence as it stands
    assert not later.may_start(4, wait=0.0) and later.may_start(5, wait=0.0)


def test_a_worker_whose_managers_lease_may_have_run_out_waits_for_its_next_heartbeat() -> None:
    fenced = slot()
    fenced.fence(time.monotonic_ns() - 1, 0)  # its manager's last beat is too old
    assert not fenced.may_start(1, wait=0.05)  # in doubt: it does not start
    answered: list[bool] = []
    waiting = threading.Thread(target=lambda: answered.append(fenced.may_start(1, wait=30)))
    waiting.start()
    try:
        fenced.fence(time.monotonic_ns() + 60 * SECOND, 0)  # the next beat: it holds
    finally:
        waiting.join(30)
    assert answered == [True]
    waiting = threading.Thread(target=lambda: answered.append(fenced.may_start(2, wait=30)))
    fenced.fence(time.monotonic_ns() - 1, 0)
    waiting.start()
    try:
        fenced.fence(time.monotonic_ns() + 60 * SECOND, 3)  # presumed dead meanwhile
    finally:
        waiting.join(30)
    assert answered == [True, False]
