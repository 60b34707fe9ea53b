"""A run window in a file that processes share: the same rules as in plain lists, claims
made by several processes at once each taken once and in order, and a lock that no
process keeps by dying."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path

import psutil
import pytest
from processes import wait_for

from mpsched._core.clock import SystemClock
from mpsched._core.run_window import EMPTY_HEAD, Claim, Entry, ListRows, RunWindow, claim_next
from mpsched._worker.window_file import WindowFile

CTX = multiprocessing.get_context("spawn")
JOIN = 60.0  # real seconds a test waits for a process it started


@pytest.fixture
def processes() -> Iterator[list[BaseProcess]]:
    """Processes a test starts: killed and joined whatever the test left them doing."""
    started: list[BaseProcess] = []
    yield started
    for proc in started:
        if proc.is_alive():
            proc.kill()
        proc.join(JOIN)


@pytest.fixture
def threads() -> Iterator[list[threading.Thread]]:
    """Threads a test starts: joined whatever the test left them doing (each ends alone)."""
    started: list[threading.Thread] = []
    yield started
    for thread in started:
        thread.join(JOIN)


@pytest.fixture
def window_file(tmp_path: Path) -> Iterator[WindowFile]:
    rows = WindowFile(str(tmp_path / "window"), 16, create=True)
    yield rows
    rows.close()


def test_a_window_in_a_file_follows_the_rules_as_one_in_lists(window_file: WindowFile) -> None:
    rng = random.Random(8)
    for by_time in (True, False):
        window_file.set_head(EMPTY_HEAD)
        lists = ListRows(window_file.capacity)
        in_file = RunWindow(window_file, by_time=by_time)
        in_lists = RunWindow(lists, by_time=by_time)
        for lease in range(1, 3_000):
            now = lease / 100
            entry = Entry(lease, now + rng.choice([0.0, 0.1, 0.5]), rng.randint(1, 3), lease)
            step = rng.random()
            if step < 0.4:
                assert in_file.place_locked(entry) == in_lists.place_locked(entry)
            elif step < 0.7:
                assert in_file.claim_locked(lease % 3, now) == in_lists.claim_locked(lease % 3, now)
            elif step < 0.8:
                assert in_file.sweep_locked(now, lease % 2) == in_lists.sweep_locked(now, lease % 2)
            elif step < 0.85:
                gone = {lease - n for n in range(0, 20, 3)}
                assert in_file.take_back_locked(gone) == in_lists.take_back_locked(gone)
            else:
                in_file.set_backlog_locked(step < 0.9)
                in_lists.set_backlog_locked(step < 0.9)
                assert in_file.ring_locked(now, claimed=True) == in_lists.ring_locked(
                    now, claimed=True
                )
            assert window_file.head() == lists.head()
            assert in_file.ready_locked() == in_lists.ready_locked()


def count_up(rows: WindowFile, times: int, go: Barrier) -> None:
    """Add one to the window's generation ``times`` times, each under its lock."""
    go.wait(JOIN)
    for _ in range(times):
        with rows.lock:
            head = rows.head()
            rows.set_head(head._replace(generation=head.generation + 1))


def test_the_lock_excludes_other_processes_and_other_threads(
    window_file: WindowFile, processes: list[BaseProcess], threads: list[threading.Thread]
) -> None:
    times = 20_000  # ~50 ms each: the four overlap, in and out of the GIL
    go = CTX.Barrier(5)  # they start together
    processes += [CTX.Process(target=count_up, args=(window_file, times, go)) for _ in range(2)]
    for proc in processes:
        proc.start()
    threads += [threading.Thread(target=count_up, args=(window_file, times, go)) for _ in range(2)]
    for thread in threads:
        thread.start()
    go.wait(JOIN)
    for thread in threads:
        thread.join(JOIN)
    for proc in processes:
        proc.join(JOIN)
        assert proc.exitcode == 0
    assert window_file.head().generation == 4 * times  # no increment lost


def claim_all(
    rows: WindowFile, taker: int, go: Event, done: Event, out: Queue[tuple[int, list[int]]]
) -> None:
    """A worker: claim every entry as soon as it is due, until ``done`` and none is left."""
    window = RunWindow(rows)
    mine: list[int] = []
    go.wait(JOIN)
    while True:
        with rows.lock:
            claim = window.claim_locked(taker, time.monotonic())
            over = claim is None and done.is_set() and not window.ready_locked()
        if claim is not None:
            mine.append(claim.lease_id)
        elif over:
            break
    out.put((taker, mine))


def test_processes_claiming_at_once_take_each_entry_once_in_order(
    window_file: WindowFile, processes: list[BaseProcess]
) -> None:
    total = 2_000
    go, done, out = CTX.Event(), CTX.Event(), CTX.Queue()
    processes += [
        CTX.Process(target=claim_all, args=(window_file, taker, go, done, out))
        for taker in range(3)
    ]
    for proc in processes:
        proc.start()
    window = RunWindow(window_file)
    swept: list[Claim] = []
    filled = 0
    go.set()
    deadline = time.monotonic() + JOIN
    while filled < total or len(swept) < total:  # the manager: refill and sweep
        assert time.monotonic() < deadline, f"{len(swept)} of {total} claimed"
        with window_file.lock:
            swept += window.sweep_locked(time.monotonic(), ended=0)
            room = min(window.room_locked(), total - filled)
            batch = [Entry(filled + n + 1, 0.0, 2, filled + n + 1) for n in range(room)]
            filled += window.fill_locked(batch)
        if filled == total:
            done.set()
    by_worker = dict(out.get(timeout=JOIN) for _ in processes)
    for proc in processes:
        proc.join(JOIN)
        assert proc.exitcode == 0
    assert [claim.lease_id for claim in swept] == list(range(1, total + 1))
    for taker, mine in by_worker.items():  # each worker ran what the log names it for
        assert mine == [claim.lease_id for claim in swept if claim.taker == taker]


def hold_the_lock(rows: WindowFile, held: Event) -> None:
    """Take the window's lock and never let it go."""
    rows.lock.__enter__()
    held.set()
    threading.Event().wait()


def free(path: str) -> bool:
    """Whether no process holds the window's lock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # lets go of the lock too
    return True


def test_a_process_killed_holding_the_lock_does_not_keep_it(
    window_file: WindowFile, processes: list[BaseProcess]
) -> None:
    held = CTX.Event()
    holder = CTX.Process(target=hold_the_lock, args=(window_file, held))
    processes.append(holder)
    holder.start()
    assert held.wait(JOIN)
    assert not free(window_file.path)
    holder.kill()
    holder.join(JOIN)
    assert free(window_file.path)
    with window_file.lock:  # and this process's own lock takes it
        assert window_file.head().generation == 0


def test_a_file_too_small_for_the_window_is_refused(tmp_path: Path) -> None:
    WindowFile(str(tmp_path / "small"), 2, create=True).close()
    with pytest.raises(ValueError, match="holds no window of 64 rows"):
        WindowFile(str(tmp_path / "small"), 64)


def sleep_then_claim(rows: WindowFile, asleep: Event, out: Queue[Claim | None]) -> None:
    """A worker that finds the window empty, says so, sleeps on it and claims."""
    window = RunWindow(rows)
    with rows.lock:
        generation = rows.head().generation
    asleep.set()
    rows.sleep(generation, 600.0)  # only a move of the generation ends it in time
    out.put(claim_next(window, rows.lock, rows, SystemClock(), 0, 0.0))


def test_a_sleeping_worker_wakes_when_an_entry_comes_in(
    window_file: WindowFile, processes: list[BaseProcess]
) -> None:
    asleep, out = CTX.Event(), CTX.Queue()
    worker = CTX.Process(target=sleep_then_claim, args=(window_file, asleep, out))
    processes.append(worker)
    worker.start()
    assert asleep.wait(JOIN)
    wait_for(lambda: psutil.Process(worker.pid).status() == psutil.STATUS_SLEEPING)
    window = RunWindow(window_file)
    with window_file.lock:
        window.fill_locked([Entry(1, time.monotonic(), 2, 1)])  # into an empty window
    window_file.wake_all()
    claim = out.get(timeout=JOIN)
    assert claim is not None and claim.lease_id == 1


def test_a_sleep_ends_at_its_timeout_or_at_once_if_the_generation_moved(
    window_file: WindowFile,
) -> None:
    start = time.monotonic()
    window_file.sleep(0, 0.05)
    assert time.monotonic() - start >= 0.05
    start = time.monotonic()
    window_file.sleep(1, 60.0)  # the generation is 0: it moved on from 1 already
    assert time.monotonic() - start < JOIN


def claim_as_due(rows: WindowFile, taker: int, count: int, out: Queue[list[Claim]]) -> None:
    """A worker claiming ``count`` entries in turn, each when it falls due, asleep between."""
    window = RunWindow(rows)
    claims: list[Claim] = []
    while len(claims) < count:
        claim = claim_next(window, rows.lock, rows, SystemClock(), taker, JOIN)
        assert claim is not None
        claims.append(claim)
    out.put(claims)


def test_workers_asleep_between_entries_claim_each_once_and_never_early(
    window_file: WindowFile, processes: list[BaseProcess]
) -> None:
    out = CTX.Queue()
    processes += [
        CTX.Process(target=claim_as_due, args=(window_file, taker, 5, out)) for taker in range(2)
    ]
    for proc in processes:
        proc.start()
    window = RunWindow(window_file)
    start = time.monotonic() + 0.2
    entries = [Entry(n, start + n * 0.01, 2, n) for n in range(1, 11)]  # 10 ms apart
    with window_file.lock:
        window.fill_locked(entries)
    window_file.wake_all()
    claims = [claim for _ in processes for claim in out.get(timeout=JOIN)]
    by_lease = {claim.lease_id: claim for claim in claims}
    assert sorted(by_lease) == list(range(1, 11)) and len(claims) == 10
    for entry in entries:
        assert by_lease[entry.lease_id].started >= entry.due
    with window_file.lock:
        swept = window.sweep_locked(time.monotonic(), ended=0)
    assert [claim.lease_id for claim in swept] == list(range(1, 11))  # claimed in order
