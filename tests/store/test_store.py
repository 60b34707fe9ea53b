"""The journal stores: what a journal store promises its manager (recovery, requeues,
seqs) on both MemoryStore and SQLiteStore, then what only SQLiteStore does. The contract
every backend keeps, Redis included, is test_store_contract.py's.

Contract tests run on MemoryStore (with results retained, as a store would) and on
SQLiteStore over a real file in tmp_path; a fake wall clock decides expiry.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_drivers import T0, TTL, job

from mpsched._core.job import JobState
from mpsched._errors import (
    ConfigError,
    InvalidJobError,
    MpschedError,
    StoreError,
    StoreFullError,
    StoreLockedError,
)
from mpsched._store import file as _store_file
from mpsched._store import pruning as _store_pruning
from mpsched._store.base import DAY, JournalStore, Recovery, Store, StoredJob, StoredSchedule
from mpsched._store.memory import MemoryStore
from mpsched._store.sqlite import SQLiteStore

JOIN = 30.0  # real seconds a test waits for a thread it started


class Wall:
    """A wall clock that moves only when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def open_sqlite(tmp_path: Path, wall: Wall) -> Iterator[Callable[..., SQLiteStore]]:
    """Open SQLite stores (default: tmp_path/jobs.db) that are closed when the test ends."""
    opened: list[SQLiteStore] = []

    def open_(path: Path | None = None, **options: Any) -> SQLiteStore:
        options.setdefault("result_ttl", TTL)
        options.setdefault("clock", wall)
        store = SQLiteStore(path or tmp_path / "jobs.db", **options)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture(params=["memory", "sqlite"])
def store(
    request: pytest.FixtureRequest, wall: Wall, open_sqlite: Callable[..., SQLiteStore]
) -> Iterator[JournalStore]:
    if request.param == "sqlite":
        yield open_sqlite()
        return
    memory = MemoryStore(result_ttl=TTL, clock=wall)
    yield memory
    memory.close()


def state_of(store: Store, job_id: str) -> JobState | None:
    store.flush()
    record = store.get(job_id)
    return None if record is None else record.state


# ------------------------------------------------------------------ the contract


def test_recovery_returns_pending_jobs_whole_in_seq_order(store: JournalStore) -> None:
    jobs = [job(3, priority=1, due=T0 + 50), job(1, retries=2), job(2, priority=3, due=T0 - 5)]
    assert store.submit(jobs[:1]) == ["job-3"]
    assert store.submit(jobs[1:]) == ["job-1", "job-2"]
    assert store.recover() == Recovery(sorted(jobs, key=lambda j: j.seq), [], 4)


def test_an_empty_store_recovers_nothing(store: JournalStore) -> None:
    assert store.recover() == Recovery([], [], 0)
    assert store.jobs() == []


def test_a_leased_job_comes_back_as_running_with_its_worker_and_attempt(
    store: JournalStore,
) -> None:
    store.submit([job(1, retries=1), job(2)])
    store.lease("job-1", "worker-7", 1)
    recovery = store.recover()
    assert [j.job_id for j in recovery.pending] == ["job-2"]
    [running] = recovery.running
    assert running.worker_id == "worker-7"
    assert running.job == job(1, retries=1)._replace(attempt=1)
    store.flush()  # listings and lookups read what is committed
    record = store.get("job-1")
    assert record is not None and record.state is JobState.RUNNING
    assert record.worker_id == "worker-7" and record.attempt == 1


def test_a_requeued_job_is_pending_again_with_its_attempts(store: JournalStore) -> None:
    store.submit([job(1, retries=3)])
    store.lease("job-1", "worker-1", 1)
    store.requeue("job-1", 1)
    store.lease("job-1", "worker-2", 2)
    store.requeue("job-1", 2)
    store.flush()
    assert store.recover().pending == [job(1, retries=3)._replace(attempt=2)]


def test_a_repeated_job_id_or_seq_fails_its_whole_batch(store: JournalStore) -> None:
    store.submit([job(1)])
    with pytest.raises(InvalidJobError):
        store.submit([job(2), job(1)._replace(seq=7)])
    with pytest.raises(InvalidJobError):
        store.submit([job(3), job(4)._replace(seq=1)])
    with pytest.raises(InvalidJobError):
        store.submit([job(5), job(5)._replace(seq=6)])
    assert [j.job_id for j in store.recover().pending] == ["job-1"]
    assert store.submit([job(2)]) == ["job-2"]  # the store goes on


def test_next_seq_follows_the_highest_seq_kept(store: JournalStore) -> None:
    store.submit([job(5), job(9)])
    store.cancel(["job-5"], T0)
    assert store.recover().next_seq == 10


def test_a_memory_store_forgets_finished_jobs_by_default() -> None:
    store = MemoryStore()
    store.submit([job(1, key="k"), job(2)])
    store.lease("job-1", "w", 1)
    store.finish("job-1", JobState.DONE, b"ok", T0)
    store.cancel(["job-2"], T0)
    assert store.get("job-1") is None and store.get("job-2") is None
    assert store.find_key("k") is None
    assert store.location == "memory" and store.size() is None


# ------------------------------------------------------------- SQLite: files


def test_jobs_survive_closing_and_reopening(open_sqlite: Callable[..., SQLiteStore]) -> None:
    first = open_sqlite()
    first.submit([job(1), job(2, key="k"), job(3), job(4)])
    first.lease("job-3", "worker-1", 1)
    first.lease("job-1", "worker-1", 1)
    first.finish("job-1", JobState.DONE, b"ok", T0)  # queued: close writes it
    first.close()
    again = open_sqlite()
    recovery = again.recover()
    assert recovery.pending == [job(2, key="k"), job(4)]
    assert [(r.job.job_id, r.worker_id) for r in recovery.running] == [("job-3", "worker-1")]
    record = again.get("job-1")
    assert record is not None and (record.state, record.outcome) == (JobState.DONE, b"ok")
    assert again.location == str(Path(again.location).resolve())
    size = again.size()
    assert size is not None and size > 0


@pytest.mark.parametrize(("durability", "level"), [("sync", 2), ("process", 1)])
def test_durability_sets_the_synchronous_pragma(
    open_sqlite: Callable[..., SQLiteStore], durability: str, level: int
) -> None:
    store = open_sqlite(durability=durability)
    assert store.durability == durability
    pragmas = store._writer.call(
        lambda conn: (
            conn.execute("PRAGMA synchronous").fetchone()[0],
            conn.execute("PRAGMA journal_mode").fetchone()[0],
        )
    )
    assert pragmas == (level, "wal")


def test_a_second_opener_is_refused_until_the_first_closes(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    first = open_sqlite()
    with pytest.raises(StoreLockedError) as refused:
        open_sqlite()
    assert refused.value.pid == os.getpid()
    assert str(tmp_path / "jobs.db") in str(refused.value)
    assert (tmp_path / "jobs.db.lock").exists()
    first.close()
    open_sqlite().submit([job(1)])


@pytest.mark.parametrize(
    "content", [b"hello, not a database\n" * 200, b"SQLite format 3\x00" + b"\x00" * 8]
)
def test_a_file_that_is_not_an_sqlite_store_is_refused_untouched(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore], content: bytes
) -> None:
    path = tmp_path / "other.dat"
    path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(StoreError, match=re.escape(str(path))):
        open_sqlite(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.dat"]


def test_an_empty_file_becomes_a_store(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    (tmp_path / "jobs.db").touch()
    open_sqlite().submit([job(1)])


def test_a_foreign_sqlite_database_is_refused_untouched(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, what TEXT)")
    conn.execute("INSERT INTO jobs VALUES (1, 'theirs')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not an mpsched store"):
        open_sqlite(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_a_store_from_a_newer_schema_is_refused_untouched(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    store = open_sqlite()
    store.submit([job(1)])
    store.close()
    conn = sqlite3.connect(tmp_path / "jobs.db")
    newer = len(_store_file.MIGRATIONS) + 1
    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (newer,))
    conn.commit()
    conn.close()
    before = (tmp_path / "jobs.db").read_bytes()
    with pytest.raises(StoreError, match=f"schema version {newer} is newer"):
        open_sqlite()
    assert (tmp_path / "jobs.db").read_bytes() == before


def _add_tags(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE tags (job_id TEXT, tag TEXT)")
    conn.execute("INSERT INTO tags SELECT job_id, 'migrated' FROM jobs")


def test_an_older_schema_is_migrated_forward_once(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = open_sqlite()
    old.submit([job(1), job(2)])
    old.close()
    monkeypatch.setattr(_store_file, "MIGRATIONS", [*_store_file.MIGRATIONS, _add_tags])
    for _ in range(2):  # the second opening finds the new version and migrates nothing
        store = open_sqlite()
        assert [j.job_id for j in store.recover().pending] == ["job-1", "job-2"]
        store.close()
    conn = sqlite3.connect(tmp_path / "jobs.db")
    assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == (
        len(_store_file.MIGRATIONS),
    )  # the patched list: one step more
    assert conn.execute("SELECT count(*) FROM tags").fetchone() == (2,)
    conn.close()


def test_a_failing_migration_leaves_the_store_as_it_was(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = open_sqlite()
    old.submit([job(1)])
    old.close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x)")
        conn.execute("SELECT * FROM no_such_table")

    monkeypatch.setattr(_store_file, "MIGRATIONS", [*_store_file.MIGRATIONS, broken])
    with pytest.raises(StoreError, match="no_such_table"):
        open_sqlite()
    monkeypatch.undo()
    store = open_sqlite()  # still the old version, unchanged, and no lock left behind
    assert [j.job_id for j in store.recover().pending] == ["job-1"]


def test_a_missing_directory_is_a_store_error_naming_the_path(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    path = tmp_path / "missing" / "jobs.db"
    with pytest.raises(StoreError, match="does not exist") as refused:
        open_sqlite(path)
    assert str(path) in str(refused.value)
    assert not (tmp_path / "missing").exists()


def test_a_read_only_directory_is_a_store_error_naming_the_path() -> None:
    # Under /tmp, not tmp_path: an unprivileged child must be able to reach it.
    directory = Path(tempfile.mkdtemp(prefix="mpsched-ro-"))
    path = directory / "jobs.db"
    directory.chmod(0o555)
    try:
        message = _open_unprivileged(str(path))
        assert list(directory.iterdir()) == []
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)
    assert message.startswith("StoreError:") and str(path) in message
    assert "not writable" in message


def _open_unprivileged(path: str) -> str:
    """Open a store at ``path`` as a user the file modes apply to; the error it raised.

    Root ignores directory modes, so as root a forked child drops to nobody first.
    """
    if os.geteuid() != 0:
        return _describe_open(path)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on, only os._exit
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, _describe_open(path).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def _describe_open(path: str) -> str:
    try:
        SQLiteStore(path).close()
    except MpschedError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "opened"


def test_a_corrupt_store_is_a_store_error_naming_the_path(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    store = open_sqlite()
    store.submit([job(n) for n in range(2000)])
    store.close()
    path = tmp_path / "jobs.db"
    with path.open("r+b") as file:  # keep the header, scribble over the pages after it
        file.seek(4096)
        file.write(os.urandom(path.stat().st_size - 8192))
    with pytest.raises(StoreError, match=re.escape(str(path))):
        open_sqlite().recover()


def test_bad_options_are_refused(open_sqlite: Callable[..., SQLiteStore]) -> None:
    for options in (
        {"durability": "fast"},
        {"result_ttl": -1},
        {"batch_size": 0},
        {"linger": -0.1},
        {"prune_interval": 0},
    ):
        with pytest.raises(ConfigError):
            open_sqlite(**options)
    open_sqlite().close()  # nothing was left locked


def test_store_errors_keep_their_type_and_message_when_pickled() -> None:
    for error in (
        StoreError("/x/jobs.db", "boom"),
        StoreLockedError("/x/jobs.db", 42),
        StoreFullError("/x/jobs.db"),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
        assert isinstance(again, OSError) and "/x/jobs.db" in str(again)


# ------------------------------------------------------- SQLite: group commit


def _in_threads(count: int, target: Callable[[int], object]) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN)
    assert not any(t.is_alive() for t in threads), "a submitter never returned"


def test_concurrent_submits_share_commits(open_sqlite: Callable[..., SQLiteStore]) -> None:
    # A long linger: a batch is written only when all 8 submitters have queued one job.
    store = open_sqlite(batch_size=8, linger=5.0)
    before = store.commits

    def submit(thread: int) -> None:
        for n in range(25):
            store.submit([job(thread * 1000 + n)])

    _in_threads(8, submit)
    assert store.commits - before == 25
    assert len(store.recover().pending) == 200


def test_ops_queued_during_a_commit_share_the_next_up_to_batch_size(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    store = open_sqlite(batch_size=4)  # no linger: the default
    store.submit([job(n) for n in range(10)])
    for n in range(10):
        store.lease(f"job-{n}", "w", 1)
    entered = threading.Event()  # set by the writer once it runs the op below
    gate = threading.Event()  # holds the writer in that op until the test has queued more

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        gate.wait(JOIN)

    store._writer.post(hold)
    assert entered.wait(JOIN)
    before = store.commits
    for n in range(10):
        store.finish(f"job-{n}", JobState.DONE, b"ok", T0)
    gate.set()
    store.flush()
    assert store.commits - before == 1 + 3  # the held batch, then 4 + 4 + 2 finishes
    assert len(store.jobs(JobState.DONE)) == 10


def test_a_lone_submit_does_not_wait_for_a_full_batch(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    store = open_sqlite(batch_size=1_000_000, linger=0.002)
    _in_threads(1, lambda _: store.submit([job(1)]))
    assert store.commits == 1


def test_an_op_that_breaks_a_rule_fails_alone_in_its_batch(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    with open_sqlite() as first:
        first.submit([job(1)])
    store = open_sqlite(batch_size=2, linger=5.0)  # a batch waits for both submitters
    errors: dict[int, BaseException] = {}

    def submit(thread: int) -> None:
        try:
            store.submit([job(1) if thread else job(2)])  # thread 1 repeats job-1
        except MpschedError as exc:
            errors[thread] = exc

    before = store.commits
    _in_threads(2, submit)
    assert store.commits - before == 1  # both were in one batch
    assert list(errors) == [1] and isinstance(errors[1], InvalidJobError)
    assert [j.job_id for j in store.recover().pending] == ["job-1", "job-2"]


def test_a_full_store_fails_that_batch_only_and_loses_nothing(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    store = open_sqlite()
    store.submit([job(1), job(2), job(3)])
    store.lease("job-1", "worker-1", 1)
    pages = store._writer.call(lambda conn: conn.execute("PRAGMA page_count").fetchone()[0])
    store._writer.call(lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}"))
    # Room is made between batches, in the writer thread, once the test says so.
    room = threading.Event()
    prune = store._writer._housekeeping

    def housekeeping(conn: sqlite3.Connection) -> bool:
        if room.is_set():
            conn.execute("PRAGMA max_page_count = 1000000")
        return prune(conn)

    store._writer._housekeeping = housekeeping
    big = b"x" * 200_000
    with pytest.raises(StoreFullError, match=re.escape(store.location)):
        store.submit([job(10, payload=big)])
    store.finish("job-1", JobState.DONE, big, T0)  # async: kept and retried, in order
    with pytest.raises(StoreFullError):
        store.submit([job(11, payload=big)])  # fails in a batch with the retried finish
    recovery = store.recover()  # what a restart would find: the lease and end are durable
    assert [j.job_id for j in recovery.pending] == ["job-2", "job-3"]
    assert recovery.running == []  # ended, in the lease log (its outcome waits for SQLite)
    room.set()
    assert store.submit([job(12, payload=big)]) == ["job-12"]
    record = store.get("job-1")
    assert record is not None and (record.state, record.outcome) == (JobState.DONE, big)
    assert [j.job_id for j in store.recover().pending] == ["job-2", "job-3", "job-12"]


def test_a_write_lock_held_by_another_program_fails_only_the_calls_it_blocked(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore]
) -> None:
    store = open_sqlite()
    store.submit([job(1)])
    other = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # as the sqlite3 shell would, for a while
    try:
        with pytest.raises(StoreError, match="locked") as refused:
            store.submit([job(2)])  # after the 2 s busy timeout
        assert store.location in str(refused.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.submit([job(3)]) == ["job-3"]
    assert [j.job_id for j in store.recover().pending] == ["job-1", "job-3"]


class _WriterBug(BaseException):
    """Escapes every ``except Exception``: stands for a bug that ends the writer thread."""


def test_callers_hear_of_a_writer_that_died_and_close_still_unlocks(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    store = open_sqlite()
    store.submit([job(1)])

    def bug(conn: sqlite3.Connection) -> None:
        raise _WriterBug

    with pytest.raises(StoreError):
        store._writer.call(bug)
    with pytest.raises(StoreError, match="closed"):
        store.submit([job(2)])
    store.close()
    assert [j.job_id for j in open_sqlite().recover().pending] == ["job-1"]


def test_the_writer_prunes_on_its_own(open_sqlite: Callable[..., SQLiteStore], wall: Wall) -> None:
    store = open_sqlite(prune_interval=60.0)
    store.submit([job(1), job(2)])
    store.cancel(["job-1"], T0)
    wall.now = T0 + TTL + 60
    store.flush()  # the writer prunes before the batch this flush waits for
    assert [r.job_id for r in store.jobs()] == ["job-2"]


def test_the_writers_prune_goes_a_step_per_transaction_and_finishes_on_its_own(
    open_sqlite: Callable[..., SQLiteStore],
    wall: Wall,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch waits for one step of a prune at most, not for all of it; the idle writer
    goes on with the next step at once, not a prune interval later."""
    monkeypatch.setattr(_store_pruning, "PRUNE_STEP", 10)
    store = open_sqlite(prune_interval=60.0)
    store.submit([job(n) for n in range(1, 27)])
    for n in range(1, 26):
        store.finish(f"job-{n}", JobState.DONE, b"ok", T0)
    store.flush()
    steps: list[int] = []  # rows each call deleted, in order (calls run one at a time)
    housekeeping = store._writer._housekeeping

    def counted(conn: sqlite3.Connection) -> bool:
        before = conn.total_changes
        more = housekeeping(conn)
        if conn.total_changes > before:
            steps.append(conn.total_changes - before)
        return more

    store._writer._housekeeping = counted
    caplog.set_level(logging.INFO, logger="mpsched.store")
    wall.now = T0 + TTL + 60
    store.flush()  # its batch runs the first step
    assert steps[:1] == [10]
    deadline = time.monotonic() + JOIN  # the prune interval is 60 s: the writer must not wait
    # The last step's rows are gone (a reader sees its commit) a moment before the step
    # returns to the counting wrapper: wait for both.
    while [r.job_id for r in store.jobs()] != ["job-26"] or sum(steps) < 25:
        assert time.monotonic() < deadline, f"the prune stopped after {steps}"
        time.sleep(0.001)
    assert steps == [10, 10, 5]
    assert "pruned 25 finished jobs" in caplog.text


def test_reads_see_commits_without_waiting_for_the_writer(
    open_sqlite: Callable[..., SQLiteStore],
) -> None:
    store = open_sqlite()
    store.submit([job(1)])
    gate = threading.Event()
    store._writer.post(lambda conn: gate.wait(JOIN))  # holds the writer inside a batch
    store.finish("job-1", JobState.DONE, b"ok", T0)  # queued behind it
    try:
        assert state_of_now(store, "job-1") is JobState.PENDING
        assert store.recover().pending == []  # its end is in the lease log already
    finally:
        gate.set()
    store.flush()
    assert state_of_now(store, "job-1") is JobState.DONE


def state_of_now(store: Store, job_id: str) -> JobState | None:
    record = store.get(job_id)
    return None if record is None else record.state


def test_results_are_kept_a_day_by_default(tmp_path: Path, wall: Wall) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", clock=wall)
    try:
        store.submit([job(1, key="k")])
        store.lease("job-1", "w", 1)
        store.finish("job-1", JobState.DONE, b"ok", T0)
        store.flush()
        wall.now = T0 + DAY - 1
        assert store.find_key("k") is not None
        wall.now = T0 + DAY
        assert store.find_key("k") is None
    finally:
        store.close()


def test_a_version_1_store_gains_the_schedules_table_and_keeps_its_jobs(
    tmp_path: Path, open_sqlite: Callable[..., SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_file, "MIGRATIONS", _store_file.MIGRATIONS[:1])
    old = open_sqlite()
    old.close()
    _insert_v1_row(tmp_path / "jobs.db", job(1))
    monkeypatch.undo()
    store = open_sqlite()
    [recovered] = store.recover().pending
    assert (recovered.job_id, recovered.queue, recovered.limit) == ("job-1", None, None)
    store.save_schedule(StoredSchedule("nightly", b"spec", b"state"))
    store.update_schedule("nightly", b"state 2")
    store.update_schedule("unknown", b"ignored")
    assert store.schedules() == [StoredSchedule("nightly", b"spec", b"state 2")]
    store.delete_schedule("nightly")
    assert store.schedules() == []


def _insert_v1_row(path: Path, stored: StoredJob) -> None:
    """A row as a version 1 store wrote it: without the columns added since."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO jobs (job_id, client_id, key, name, payload, priority, "
            "due_wall, seq, timeout, retries, attempt, submitted_wall, state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending')",
            stored[:12],
        )
    conn.close()
