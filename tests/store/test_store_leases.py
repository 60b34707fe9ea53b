"""The lease log: leases are journalled by one append (with sync, on disk soon after), SQLite
gets them later, and what a crash or a power cut leaves in the log is read back exactly up to
the last whole record.

"A crash" is taken literally where it can be: the store's files are copied while its writer
is held inside a batch, which is what the disk holds if the manager dies at that instant.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeclock import FakeClock
from store.test_store_writer import Held

from mpsched._core.job import JobState
from mpsched._core.queue import JobQueue
from mpsched._errors import StoreError, StoreFullError
from mpsched._manager.store_journal import Journal
from mpsched._store import group_sync as _group_sync
from mpsched._store import lease_log as _store_leases
from mpsched._store import lease_records
from mpsched._store.base import StoredJob
from mpsched._store.lease_log import LeaseLog
from mpsched._store.lease_records import LogRecord
from mpsched._store.sqlite import SQLiteStore

T0 = 1.8e9
JOIN = 30.0  # real seconds a test waits for the writer


def job(n: int, retries: int = 0) -> StoredJob:
    return StoredJob(
        f"job-{n}",
        "client-1",
        None,
        "tests.jobs:work",
        b"payload",
        2,
        T0 + n,
        n,
        None,
        retries,
        0,
        T0,
    )


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., SQLiteStore]]:
    """Open SQLite stores (default tmp_path/jobs.db), closed when the test ends."""
    opened: list[SQLiteStore] = []

    def open_(path: Path | None = None, **options: Any) -> SQLiteStore:
        options.setdefault("prune_interval", 3600.0)
        store = SQLiteStore(path or tmp_path / "jobs.db", clock=lambda: T0, **options)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def open_log(tmp_path: Path) -> Iterator[Callable[..., LeaseLog]]:
    """Lease logs on tmp_path/log (a fresh epoch each), released when the test ends."""
    opened: list[LeaseLog] = []

    def open_(**options: Any) -> LeaseLog:
        options.setdefault("sync", False)
        options.setdefault("flush", lambda: None)
        log = LeaseLog(str(tmp_path / "log"), **options)
        log.reset()
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.release(remove=False)


def crash_copy(src: Path, dst: Path) -> Path:
    """The store's files as a crash now would leave them (the lock file is not one)."""
    dst.mkdir()
    for suffix in ("", "-wal", "-leases"):
        if (src.parent / (src.name + suffix)).exists():
            shutil.copyfile(src.parent / (src.name + suffix), dst / (src.name + suffix))
    return dst / src.name


def row(path: Path, job_id: str) -> tuple[str, str | None, int]:
    """A job's state, worker and attempt as SQLite has them, read past the store."""
    conn = sqlite3.connect(path)
    try:
        found = conn.execute(
            "SELECT state, worker_id, attempt FROM jobs WHERE job_id = ?", (job_id,)
        ).fetchone()
    finally:
        conn.close()
    assert found is not None
    return found[0], found[1], found[2]


def lease(n: int, attempt: int = 1, worker: str = "w1") -> LogRecord:
    return LogRecord(f"job-{n}", True, attempt, worker)


def no_room(at_least: int) -> Callable[[int, bytes, int], int]:
    """An os.pwrite for a full disk: writes of ``at_least`` bytes or more fail (ENOSPC)."""
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if len(data) >= at_least:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    return pwrite


# ------------------------------------------------------------------ the store


def test_a_lease_is_durable_before_sqlite_has_it(
    tmp_path: Path, open_store: Callable[..., SQLiteStore]
) -> None:
    store = open_store()
    store.submit([job(1), job(2, retries=2), job(3)])
    held = Held(store)
    try:
        store.lease("job-1", "w1", 1)
        store.lease("job-2", "w2", 1)
        store.requeue("job-2", 1)  # its worker died: pending again, one attempt used
        store.lease("job-2", "w1", 2)
        store.lease("job-3", "w2", 1)
        store.requeue("job-3", 0)  # never received: pending, no attempt used
        crashed = crash_copy(tmp_path / "jobs.db", tmp_path / "crashed")
    finally:
        held.release()
    assert row(crashed, "job-1") == ("pending", None, 0)  # SQLite never heard of the lease
    recovered = open_store(crashed)
    recovery = recovered.recover()
    assert [(r.job.job_id, r.worker_id, r.job.attempt) for r in recovery.running] == [
        ("job-1", "w1", 1),
        ("job-2", "w1", 2),
    ]
    assert [(j.job_id, j.attempt) for j in recovery.pending] == [("job-3", 0)]
    # Opening folded the log into SQLite, for every reader of the file, and emptied it.
    assert row(crashed, "job-2") == ("running", "w1", 2)
    assert recovered._leases.read() == []


def test_a_finished_job_stays_finished_whatever_the_log_says(
    tmp_path: Path, open_store: Callable[..., SQLiteStore]
) -> None:
    store = open_store()
    store.submit([job(1), job(2)])
    store.lease("job-1", "w1", 1)
    store.finish("job-1", JobState.DONE, b"ok", T0)
    store.lease("job-2", "w1", 1)
    store.cancel(["job-2"], T0)  # running: not cancelled (pending jobs only)
    store.flush()
    crashed = crash_copy(tmp_path / "jobs.db", tmp_path / "crashed")
    recovered = open_store(crashed)
    recovery = recovered.recover()
    assert [r.job.job_id for r in recovery.running] == ["job-2"]
    assert row(crashed, "job-1") == ("done", "w1", 1)


def test_a_finish_is_durable_before_sqlite_has_it_and_a_lost_outcome_says_so(
    tmp_path: Path, open_store: Callable[..., SQLiteStore]
) -> None:
    store = open_store()
    store.submit([job(1), job(2, retries=1), job(3)])
    held = Held(store)
    try:
        store.lease("job-1", "w1", 1)
        store.finish("job-1", JobState.DONE, b"result-1", T0 + 1)
        store.lease("job-2", "w2", 1)
        store.finish("job-2", JobState.FAILED, b"error-2", T0 + 2)
        store.lease("job-3", "w1", 1)
        # The end of a job whose outcome is too long for the log, the manager killed
        # before SQLite had it (finish() itself waits for that commit).
        long = b"x" * (lease_records.OUTCOME_IN_LOG + 1)
        record = lease_records.ended("job-3", JobState.DONE, T0 + 3, long)
        assert record.outcome is None
        store._leases.append(record, lambda: None)
        crashed = crash_copy(tmp_path / "jobs.db", tmp_path / "crashed")
    finally:
        held.release()
    assert row(crashed, "job-1") == ("pending", None, 0)  # SQLite never heard of either
    recovered = open_store(crashed)
    recovery = recovered.recover()
    assert recovery.running == [] and recovery.pending == []  # none ran again, or crashed
    ended = {n: recovered.get(f"job-{n}") for n in (1, 2, 3)}
    assert [
        (r.state, r.worker_id, r.attempt, r.finished_wall, r.outcome)
        for r in ended.values()
        if r is not None
    ] == [
        (JobState.DONE, "w1", 1, T0 + 1, b"result-1"),
        (JobState.FAILED, "w2", 1, T0 + 2, b"error-2"),
        (JobState.DONE, "w1", 1, T0 + 3, None),
    ]
    journal = Journal(recovered, JobQueue(clock=FakeClock()))
    lost = journal.watch("client-2", "job-3")  # told at once, not left waiting
    assert lost is not None and lost.error_kind == "outcome-lost" and not lost.ok
    assert "job-3 ran to its end, but its outcome was lost" in str(pickle.loads(lost.payload))


def test_a_long_outcome_is_committed_before_finish_returns(
    tmp_path: Path, open_store: Callable[..., SQLiteStore]
) -> None:
    store = open_store()
    store.submit([job(1)])
    store.lease("job-1", "w1", 1)
    long = b"y" * (lease_records.OUTCOME_IN_LOG + 1)
    store.finish("job-1", JobState.DONE, long, T0)
    crashed = crash_copy(tmp_path / "jobs.db", tmp_path / "crashed")
    assert row(crashed, "job-1") == ("done", "w1", 1)  # in SQLite itself, not only the log
    record = open_store(crashed).get("job-1")
    assert record is not None and record.outcome == long


def test_recover_sees_leases_sqlite_has_not_written(open_store: Callable[..., SQLiteStore]) -> None:
    store = open_store()
    store.submit([job(1), job(2)])
    held = Held(store)
    try:
        store.lease("job-2", "w1", 1)
        recovery = store.recover()
    finally:
        held.release()
    assert [j.job_id for j in recovery.pending] == ["job-1"]
    assert [(r.job.job_id, r.worker_id) for r in recovery.running] == [("job-2", "w1")]


def test_a_closed_store_leaves_no_log_and_a_crashed_one_keeps_it(
    tmp_path: Path, open_store: Callable[..., SQLiteStore]
) -> None:
    store = open_store()
    store.submit([job(1)])
    store.lease("job-1", "w1", 1)
    log = tmp_path / "jobs.db-leases"
    assert log.stat().st_size > 0
    size = store.size()
    assert size is not None and size >= log.stat().st_size  # status counts it
    store.close()
    assert not log.exists()
    assert row(tmp_path / "jobs.db", "job-1") == ("running", "w1", 1)


def caught_up(log: LeaseLog) -> None:
    """Wait until the log's flusher has flushed for every region left so far."""
    deadline = time.monotonic() + JOIN
    while log._committed < log._flush_wanted:
        assert time.monotonic() < deadline, "the flusher never caught up"
        time.sleep(0.001)


def test_regions_are_written_again_once_their_changes_are_committed(
    tmp_path: Path, open_store: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_leases, "LIMIT", 4096)
    store = open_store()
    store.submit([job(n) for n in range(1, 501)])
    log = tmp_path / "jobs.db-leases"
    assert log.stat().st_size == 2 * 4096  # two regions, written once at open
    for n in range(1, 501):  # ~20 KB of records
        store.lease(f"job-{n}", "w1", 1)
        caught_up(store._leases)  # a store that keeps up: the log never grows
    assert log.stat().st_size == 2 * 4096
    crashed = crash_copy(tmp_path / "jobs.db", tmp_path / "crashed")
    assert len(open_store(crashed).recover().running) == 500  # none lost by a reuse


def test_a_lease_the_log_has_no_room_for_is_refused_and_leaves_the_job_pending(
    open_store: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_leases, "LIMIT", 4096)  # ~100 leases a region
    store = open_store()
    store.submit([job(n) for n in range(1, 301)])
    held = Held(store)  # the store does not commit: the log must grow after two regions
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", no_room(0))  # the zeros it must grow by
    refused = None
    for n in range(1, 301):
        try:
            store.lease(f"job-{n}", "w1", 1)
        except StoreFullError as exc:
            assert "jobs.db-leases" in str(exc)
            refused = n
            break
    assert refused is not None and refused > 100
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    store.lease("job-300", "w1", 1)  # grows now
    held.release()
    recovery = store.recover()
    running = {r.job.job_id for r in recovery.running}
    assert running == {f"job-{n}" for n in range(1, refused)} | {"job-300"}
    assert f"job-{refused}" in {j.job_id for j in recovery.pending}
    store.flush()
    assert store.get(f"job-{refused}").state is JobState.PENDING  # type: ignore[union-attr]


def test_a_sync_lease_is_handed_out_before_its_fdatasync_returns(
    open_store: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With sync, a lease is written, not waited for: the log's syncer thread puts it on
    disk (~2 ms later), while the job is already on its way."""
    inside, go = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow(fd: int) -> None:
        inside.set()
        assert go.wait(JOIN)
        real(fd)

    store = open_store(durability="sync")
    store.submit([job(1)])
    monkeypatch.setattr(os, "fdatasync", slow)
    try:
        store.lease("job-1", "w1", 1)  # returns although the disk has not answered
        assert inside.wait(JOIN)  # the syncer is on it meanwhile
        assert [r.job.job_id for r in store.recover().running] == ["job-1"]
    finally:
        go.set()
    assert store._leases.wait_synced(1, JOIN)


def test_a_store_whose_log_cannot_be_emptied_at_open_is_refused_and_leaves_nothing_behind(
    tmp_path: Path, open_store: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwrite", no_room(_store_leases.LIMIT))  # the log's zeros
    with pytest.raises(StoreFullError, match=r"jobs\.db-leases"):
        SQLiteStore(tmp_path / "jobs.db", durability="sync")
    assert not [t for t in threading.enumerate() if t.name == "mpsched-lease-sync"]
    monkeypatch.undo()
    open_store(durability="sync").submit([job(1)])  # nothing holds the lock any more


# ------------------------------------------------------------------ the log alone


def test_records_read_back_in_order(open_log: Callable[..., LeaseLog]) -> None:
    log = open_log()
    records = [lease(1), LogRecord("job-1", False, 1, None), lease(1, 2, "wé"), lease(2)]
    for record in records:
        log.append(record, lambda: None)
    assert log.read() == records


def test_a_torn_last_record_is_dropped_and_the_rest_kept(
    tmp_path: Path, open_log: Callable[..., LeaseLog]
) -> None:
    log = open_log()
    for n in range(3):
        log.append(lease(n), lambda: None)
    path = tmp_path / "log"
    whole = path.read_bytes()[: log._size]
    two = len(whole) - (len(whole) // 3)  # the records are the same size
    for cut in range(two, len(whole)):
        path.write_bytes(whole[:cut])
        assert log.read() == [lease(0), lease(1)], cut
    path.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))  # a flipped bit
    assert log.read() == [lease(0), lease(1)]


def test_records_left_behind_by_a_reuse_or_an_earlier_epoch_are_not_read(
    tmp_path: Path, open_log: Callable[..., LeaseLog]
) -> None:
    flushes: list[int] = []
    one = len(_record_bytes(tmp_path, lease(1)))
    log = open_log(flush=lambda: flushes.append(1), limit=2 * one)  # two records a region
    for n in (1, 2, 3):  # 3 opens region 1: region 0 is flushed behind it
        log.append(lease(n), lambda: None)
    caught_up(log)
    assert flushes
    for n in (4, 5):  # 5 opens region 0 again, at its start
        log.append(lease(n), lambda: None)
    assert (tmp_path / "log").stat().st_size == 4 * one  # reused, not grown
    assert log.read() == [lease(3), lease(4), lease(5)]  # lease(2) follows 5: a lower ticket
    # A new epoch whose zeros a power cut lost: the old records follow the new one.
    path = tmp_path / "log"
    old = path.read_bytes()
    log.reset()
    log.append(lease(6), lambda: None)
    path.write_bytes(path.read_bytes()[:one] + old[one:])
    assert log.read() == [lease(6)]


def _record_bytes(tmp_path: Path, record: LogRecord) -> bytes:
    """One record's bytes, as a log of its own writes them."""
    log = LeaseLog(str(tmp_path / "measure"), sync=False, flush=lambda: None)
    try:
        log.reset()
        log.append(record, lambda: None)
        return (tmp_path / "measure").read_bytes()[: log._size]
    finally:
        log.release(remove=True)


def failing() -> None:
    """A store's flush when the store cannot commit."""
    raise StoreError("jobs.db", "full")


def test_a_failed_or_short_growth_keeps_the_records_and_the_next_append_grows_the_log(
    tmp_path: Path, open_log: Callable[..., LeaseLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    one = len(_record_bytes(tmp_path, lease(1)))
    log = open_log(limit=one, flush=failing)  # one record a region
    log.append(lease(1), lambda: None)
    log.append(lease(2), lambda: None)  # region 1, empty at open
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, at: real_pwrite(fd, data[:9], at))
    with pytest.raises(StoreFullError, match="log"):
        log.append(lease(3), lambda: None)  # region 0 is not committed: the log must grow
    assert log.read() == [lease(1), lease(2)]
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    log.append(lease(4), lambda: None)
    log.append(lease(5), lambda: None)
    assert log.read() == [lease(1), lease(2), lease(4), lease(5)]


def test_an_append_never_waits_for_the_store(
    tmp_path: Path, open_log: Callable[..., LeaseLog]
) -> None:
    """Leaving a region asks for a flush of the store; the append goes on at once. While
    the flush is under way the log grows; once it is done, the oldest regions come back."""
    inside, go = threading.Event(), threading.Event()

    def slow() -> None:
        inside.set()
        assert go.wait(JOIN)

    one = len(_record_bytes(tmp_path, lease(1)))
    log = open_log(limit=2 * one, flush=slow)
    appended = threading.Event()

    def appends() -> None:
        for n in range(1, 9):  # four regions' worth
            log.append(lease(n), lambda: None)
        appended.set()

    writer = threading.Thread(target=appends)
    writer.start()
    try:
        assert appended.wait(JOIN), "an append waited for the store's flush"
        assert inside.wait(JOIN)  # the flusher is inside the flush meanwhile
        assert (tmp_path / "log").stat().st_size == 4 * 2 * one  # grew by two regions
    finally:
        go.set()
        writer.join(JOIN)
    caught_up(log)
    for n in range(9, 17):  # four more regions' worth: the ones flushed are written again
        log.append(lease(n), lambda: None)
        caught_up(log)
    assert (tmp_path / "log").stat().st_size == 4 * 2 * one
    assert log.read()[-4:] == [lease(n) for n in range(13, 17)]


def test_what_is_read_is_the_latest_records_and_every_one_not_committed(
    open_log: Callable[..., LeaseLog],
) -> None:
    """Whatever the flushes do, reading finds a tail of what was written, in order, that
    holds every record whose change the store may not have committed."""
    rng, flushes = random.Random(11), random.Random(12)

    def flaky() -> None:  # in the flusher thread
        if flushes.random() < 0.3:
            raise StoreError("jobs.db", "busy")

    log = open_log(limit=300, flush=flaky)
    written: list[LogRecord] = []
    for _ in range(2000):
        running = rng.random() < 0.7
        record = LogRecord(
            f"job-{rng.randrange(10 ** rng.randrange(1, 6))}",
            running,
            rng.randrange(1, 4),
            "w1" if running else None,
        )
        log.append(record, lambda: None)
        written.append(record)
        if rng.random() < 0.05:
            committed = log._committed  # records up to it may have been written over
            found = log.read()
            assert found == written[len(written) - len(found) :]
            assert len(found) >= len(written) - committed


def test_a_record_whose_store_change_cannot_be_queued_is_wiped(
    open_log: Callable[..., LeaseLog],
) -> None:
    log = open_log()
    log.append(lease(1), lambda: None)

    def closed() -> None:
        raise StoreError("jobs.db", "the store is closed")

    with pytest.raises(StoreError):
        log.append(lease(2), closed)
    assert log.read() == [lease(1)]


def test_process_appends_never_fdatasync(
    open_log: Callable[..., LeaseLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    log = open_log()
    ticket = log.append(lease(1), lambda: None)
    assert not log.wait_synced(ticket, 0.0)
    log.release(remove=False)
    assert calls == []


def test_sync_appends_never_wait_and_one_fdatasync_covers_all_written_before_it(
    open_log: Callable[..., LeaseLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    inside, go = threading.Event(), threading.Event()
    calls: list[int] = []
    real = os.fdatasync

    def slow(fd: int) -> None:
        calls.append(fd)
        inside.set()
        assert go.wait(JOIN)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    log = open_log(sync=True)
    try:
        first = log.append(lease(1), lambda: None)
        assert inside.wait(JOIN)  # an idle syncer starts at once
        # Written while that fdatasync() is under way: appends return, the next one covers
        # both.
        log.append(lease(2), lambda: None)
        third = log.append(lease(3), lambda: None)
        assert not log.wait_synced(first, 0.0)
    finally:
        go.set()
    assert log.wait_synced(third, JOIN)
    assert len(calls) == 2


def test_release_syncs_what_an_interval_held_back(
    open_log: Callable[..., LeaseLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_group_sync, "SYNC_INTERVAL", 3600.0)
    calls: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    log = open_log(sync=True)
    assert log.wait_synced(log.append(lease(1), lambda: None), JOIN)
    second = log.append(lease(2), lambda: None)  # the syncer waits out its interval
    assert not log.wait_synced(second, 0.0)
    log.release(remove=False)  # ends the interval: the last records go to disk first
    assert len(calls) == 2 and log.wait_synced(second, 0.0)


def test_a_failed_fdatasync_is_logged_and_tried_again(
    open_log: Callable[..., LeaseLog],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_group_sync, "SYNC_BACKOFF", 0.01)
    failures = [OSError(errno.EIO, os.strerror(errno.EIO))] * 3
    real = os.fdatasync

    def flaky(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", flaky)
    caplog.set_level("WARNING", logger="mpsched.store")
    log = open_log(sync=True)
    assert log.wait_synced(log.append(lease(1), lambda: None), JOIN)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "fdatasync() failed" in errors[0].getMessage()
    assert "log: fdatasync() works again" in caplog.text


def test_a_failed_flush_keeps_every_region_and_the_log_grows_instead(
    tmp_path: Path, open_log: Callable[..., LeaseLog]
) -> None:
    one = len(_record_bytes(tmp_path, lease(1)))
    log = open_log(flush=failing, limit=one)
    for n in range(4):
        log.append(lease(n), lambda: None)
    assert log.read() == [lease(n) for n in range(4)]  # nothing was written over unflushed
    assert (tmp_path / "log").stat().st_size == 4 * one


def test_a_flush_that_began_before_a_reset_commits_nothing_after_it(
    tmp_path: Path, open_log: Callable[..., LeaseLog]
) -> None:
    was_reset, again = threading.Event(), threading.Event()
    log: LeaseLog | None = None

    def flush() -> None:  # the first one spans a reset; the store fails the next ones
        if not was_reset.is_set():
            assert log is not None
            log.reset()
            was_reset.set()
            return
        again.set()
        raise StoreError("jobs.db", "full")

    one = len(_record_bytes(tmp_path, lease(11)))  # two digits: each record this size
    log = open_log(limit=2 * one, flush=flush)
    for n in (11, 12, 13):  # 13 leaves region 0: the flush covers tickets 1-3 of that epoch
        log.append(lease(n), lambda: None)
    assert was_reset.wait(JOIN)
    for n in (21, 22, 23):  # the new epoch's tickets 1-3: 23 leaves region 0
        log.append(lease(n), lambda: None)
    assert again.wait(JOIN)  # the first flush is over: its tickets were not counted
    for n in (24, 25):  # 25 needs a region: region 0 holds uncommitted 21 and 22
        log.append(lease(n), lambda: None)
    assert log.read() == [lease(n) for n in range(21, 26)]
    assert (tmp_path / "log").stat().st_size == 3 * 2 * one


def test_a_record_longer_than_a_region_is_refused(open_log: Callable[..., LeaseLog]) -> None:
    log = open_log(limit=64)
    with pytest.raises(StoreError, match="longer than a region"):
        log.append(LogRecord("job-" + "x" * 64, True, 1, "w1"), lambda: None)
    log.append(lease(1), lambda: None)
    assert log.read() == [lease(1)]
