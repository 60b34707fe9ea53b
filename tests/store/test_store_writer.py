"""SQLiteStore's writer: who writes a batch, and what a batch of mixed ops does.

A batch is pinned by holding the current one open (an op that waits on a gate) while the
test queues the next: everything queued meanwhile is written as one batch, in order.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mpsched._core.job import JobState
from mpsched._errors import MpschedError, StoreError
from mpsched._store.base import StoredJob
from mpsched._store.commit import execute_rows
from mpsched._store.sqlite import SQLiteStore
from mpsched._store.statements import LEASE, ROWS_PER_INSERT, insert_rows

T0 = 1.8e9
JOIN = 30.0  # real seconds a test waits for a thread it started, or for the writer


def job(n: int) -> StoredJob:
    return StoredJob(
        f"job-{n}", "client-1", None, "tests.jobs:work", b"payload", 2, T0 + n, n, None, 0, 0, T0
    )


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., SQLiteStore]]:
    """Open stores on tmp_path/jobs.db (no idle prune during a test); closed at the end."""
    opened: list[SQLiteStore] = []

    def open_(**options: Any) -> SQLiteStore:
        options.setdefault("prune_interval", 3600.0)
        store = SQLiteStore(tmp_path / "jobs.db", clock=lambda: T0, **options)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


class Held:
    """Holds the writer inside a batch until ``release``; ops queued meanwhile wait."""

    def __init__(self, store: SQLiteStore) -> None:
        self.entered = threading.Event()  # set by the writer once it runs the holding op
        self.gate = threading.Event()  # the holding op returns once this is set
        store._writer.post(self._hold)
        assert self.entered.wait(JOIN)

    def _hold(self, conn: sqlite3.Connection) -> None:
        self.entered.set()
        self.gate.wait(JOIN)

    def release(self) -> None:
        self.gate.set()


class Caller:
    """A durable call in its own thread; ``wait_queued`` returns once its op is queued."""

    def __init__(self, store: SQLiteStore, call: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self._store = store
        self._queued_before = len(store._writer._queue._ops)
        self._thread = threading.Thread(target=self._run, args=(call,))
        self._thread.start()
        self.wait_queued()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except MpschedError as exc:
            self.error = exc

    def wait_queued(self) -> None:
        deadline = time.monotonic() + JOIN
        while len(self._store._writer._queue._ops) <= self._queued_before:
            assert time.monotonic() < deadline, "the call never queued its op"
            time.sleep(0.001)

    def join(self) -> BaseException | None:
        self._thread.join(JOIN)
        assert not self._thread.is_alive(), "a durable call never returned"
        return self.error


def durable_lease(store: SQLiteStore, job_id: str, worker_id: str, attempt: int) -> None:
    """A lease as one durable statement op of the writer (``store.lease`` itself is made
    durable by the lease log, and its row is written asynchronously)."""
    store._writer.call_update(LEASE.one, (worker_id, attempt, job_id), job_id)


def state(store: SQLiteStore, job_id: str) -> tuple[JobState, str | None, int] | None:
    record = store.get(job_id)
    return None if record is None else (record.state, record.worker_id, record.attempt)


def test_a_lone_durable_call_commits_in_its_callers_thread(
    open_store: Callable[..., SQLiteStore],
) -> None:
    store = open_store()
    store.submit([job(1)])
    before = store.commits
    assert store._writer.call(lambda conn: threading.get_ident()) == threading.get_ident()
    assert store.commits - before == 1


def test_async_ops_are_written_without_a_flush(open_store: Callable[..., SQLiteStore]) -> None:
    store = open_store()
    store.submit([job(1)])
    store.lease("job-1", "w", 1)
    store.finish("job-1", JobState.DONE, b"ok", T0)
    deadline = time.monotonic() + JOIN
    while (seen := state(store, "job-1")) is None or seen[0] is not JobState.DONE:
        assert time.monotonic() < deadline, f"the finish was never written: {seen}"
        time.sleep(0.001)


def test_a_flush_and_a_close_do_not_wait_out_the_linger(
    open_store: Callable[..., SQLiteStore],
) -> None:
    first = open_store()
    first.submit([job(1)])
    first.close()
    store = open_store(linger=10.0)  # a batch waits up to 10 s for 512 rows
    store.recover()
    store.lease("job-1", "w", 1)
    store.finish("job-1", JobState.DONE, b"ok", T0)
    start = time.monotonic()
    store.flush()  # nothing more is worth waiting for: written now
    assert state(store, "job-1") == (JobState.DONE, "w", 1)
    store.close()
    assert time.monotonic() - start < 5.0  # far below the linger


def test_a_batch_applies_async_and_durable_ops_in_order(
    open_store: Callable[..., SQLiteStore],
) -> None:
    store = open_store()
    store.submit([job(n) for n in range(1, 6)])
    for n in (1, 2, 3):
        store.lease(f"job-{n}", "w1", 1)
    held = Held(store)
    before = store.commits
    store.requeue("job-1", 1)  # then leased again below: the lease must come second
    lease = Caller(store, lambda: durable_lease(store, "job-1", "w2", 2))
    store.finish("job-2", JobState.DONE, b"two", T0)
    cancel = Caller(store, lambda: store.cancel(["job-4"], T0))  # a function between them
    store.finish("job-3", JobState.FAILED, b"three", T0)
    last = Caller(store, lambda: durable_lease(store, "job-5", "w3", 1))
    store.finish("job-5", JobState.DONE, b"five", T0)  # after its lease, same batch
    held.release()
    assert (lease.join(), cancel.join(), last.join()) == (None, None, None)
    store.flush()
    assert store.commits - before == 1 + 1 + 1  # the held batch, one for all, the flush
    assert state(store, "job-1") == (JobState.RUNNING, "w2", 2)
    assert state(store, "job-2") == (JobState.DONE, "w1", 1)
    assert state(store, "job-3") == (JobState.FAILED, "w1", 1)
    assert state(store, "job-4") == (JobState.CANCELLED, None, 0)
    assert state(store, "job-5") == (JobState.DONE, "w3", 1)
    record = store.get("job-5")
    assert record is not None and record.outcome == b"five"


def test_a_failed_batch_fails_exactly_its_durable_callers(
    open_store: Callable[..., SQLiteStore],
) -> None:
    store = open_store(batch_size=3)
    store.submit([job(n) for n in range(1, 4)])
    store.lease("job-1", "w1", 1)
    held = Held(store)
    store.finish("job-1", JobState.DONE, b"one", T0)  # async: kept, retried, written
    lease = Caller(store, lambda: durable_lease(store, "job-2", "w1", 1))
    broken = Caller(
        store,
        lambda: store._writer.call(
            lambda conn: conn.execute("INSERT INTO no_such_table VALUES (1)")
        ),
    )
    # A 4th row: the next batch.
    later = Caller(store, lambda: durable_lease(store, "job-3", "w2", 1))
    held.release()
    assert isinstance(lease.join(), StoreError)
    assert isinstance(broken.join(), StoreError)
    assert later.join() is None
    store.flush()
    assert state(store, "job-1") == (JobState.DONE, "w1", 1)
    assert state(store, "job-2") == (JobState.PENDING, None, 0)
    assert state(store, "job-3") == (JobState.RUNNING, "w2", 1)


def test_callers_queued_during_a_batch_share_the_next_commit(
    open_store: Callable[..., SQLiteStore],
) -> None:
    store = open_store()
    store.submit([job(n) for n in range(1, 9)])
    held = Held(store)
    before = store.commits
    callers = [
        Caller(store, functools.partial(durable_lease, store, f"job-{n}", "w", 1))
        for n in range(1, 9)
    ]
    held.release()
    assert [c.join() for c in callers] == [None] * 8
    assert store.commits - before == 2  # the held batch, then one for all eight
    assert len(store.jobs(JobState.RUNNING)) == 8


def test_a_statement_that_breaks_a_rule_fails_alone_in_its_run(
    open_store: Callable[..., SQLiteStore], caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store()
    keyed = job(1)._replace(key="k")
    store.submit([keyed])
    store.cancel(["job-1"], T0)  # frees its key for job-2
    store.submit([job(2)._replace(key="k"), job(3), job(4)])
    store.lease("job-3", "w", 1)
    held = Held(store)
    store.finish("job-3", JobState.DONE, b"three", T0)
    store.finish("job-1", JobState.DONE, b"one", T0)  # would hold "k" twice: refused
    lease = Caller(store, lambda: durable_lease(store, "job-4", "w", 1))
    held.release()
    assert lease.join() is None
    store.flush()
    assert state(store, "job-1") == (JobState.CANCELLED, None, 0)
    assert state(store, "job-3") == (JobState.DONE, "w", 1)
    assert state(store, "job-4") == (JobState.RUNNING, "w", 1)
    assert "refused" in caplog.text


def test_with_sync_a_batch_nobody_waits_for_is_fsynced_too(
    open_store: Callable[..., SQLiteStore],
) -> None:
    """A finish is on disk within the writer's delay, not only at the next durable caller's
    commit (which may never come)."""
    store = open_store(durability="sync")
    level = "PRAGMA synchronous"  # inside a batch: the level its commit will use
    seen: list[int] = []
    done = threading.Event()

    def record(conn: sqlite3.Connection) -> None:
        seen.append(conn.execute(level).fetchone()[0])
        done.set()

    store._writer.post(record)  # nobody waits: the writer thread commits it
    assert done.wait(JOIN)
    assert seen == [2]  # FULL


class Recorder:
    """Stands in for a connection: keeps each statement's SQL and parameters."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[object]]] = []

    def execute(self, sql: str, params: list[object]) -> None:
        self.calls.append((sql, params))


def test_multi_row_statements_come_in_a_few_sizes_and_keep_the_rows_in_order() -> None:
    """Batches come in every size; their statements in powers of two of rows only, so that
    a connection prepares a handful of statements (a new size once cost as much as running
    it) instead of one per size."""
    sizes: set[int] = set()
    for count in range(600):
        rows = [(n, f"job-{n}") for n in range(count)]
        conn = Recorder()
        execute_rows(conn, lambda n: f"rows {n}", rows, 256)  # type: ignore[arg-type]
        flat: list[object] = []
        for sql, params in conn.calls:
            size = int(sql.split()[1])
            assert size & (size - 1) == 0 and size <= 256, (count, size)
            assert len(params) == 2 * size
            sizes.add(size)
            flat.extend(params)
        assert flat == [value for row in rows for value in row]
    assert sizes == {1 << k for k in range(9)}


def test_batches_of_odd_sizes_are_written_whole(open_store: Callable[..., SQLiteStore]) -> None:
    store = open_store(durability="process")
    store.submit([job(n) for n in range(1, 778)])  # 512 + 256 + 8 + 1 rows
    held = Held(store)
    for n in range(1, 301):  # one batch: 256 + 32 + 8 + 4 rows
        store.finish(f"job-{n}", JobState.DONE, b"ok", T0)
    held.release()
    store.flush()
    states = [(record.job_id, record.state) for record in store.jobs()]
    assert states == [
        (f"job-{n}", JobState.DONE if n <= 300 else JobState.PENDING) for n in range(1, 778)
    ]


def test_an_insert_statement_stays_under_sqlites_limit_of_parameters(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "limits.db")
    try:
        if sys.version_info >= (3, 11):
            limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        else:  # the default of the SQLite in use
            limit = 32766 if sqlite3.sqlite_version_info >= (3, 32) else 999
    finally:
        conn.close()
    assert insert_rows(ROWS_PER_INSERT).count("?") <= limit
