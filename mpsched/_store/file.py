"""An SQLite file as a job store: what is refused, the lock file, the schema and migrations.

Opening refuses, without writing a byte, a file that is not an mpsched store (not SQLite, or
SQLite without our application id and meta table) or one from a newer schema; an older
schema is migrated forward through ``MIGRATIONS`` in one transaction. One manager per store:
``PATH.lock`` beside it is flock()ed for the store's life and names the holder's pid.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import urllib.parse
from collections.abc import Callable

from mpsched._core.options import Durability
from mpsched._errors import StoreError, StoreLockedError
from mpsched._store.commit import translate

log = logging.getLogger("mpsched.store")

APPLICATION_ID = 0x6D707363  # "mpsc" in the file header: how a store is told from others
_HEADER = b"SQLite format 3\x00"
# SQLite's synchronous setting for each durability
SYNCHRONOUS = {Durability.SYNC: "FULL", Durability.PROCESS: "NORMAL"}


def _create_v1(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value NOT NULL)")
    # seq is the rowid: recovery reads pending jobs in rowid order, max(seq) is O(1).
    conn.execute("""CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL UNIQUE, client_id TEXT NOT NULL,
        key TEXT, name TEXT NOT NULL, payload BLOB NOT NULL, priority INTEGER NOT NULL,
        due_wall REAL NOT NULL, timeout REAL, retries INTEGER NOT NULL,
        attempt INTEGER NOT NULL, submitted_wall REAL NOT NULL, state TEXT NOT NULL,
        worker_id TEXT, finished_wall REAL, outcome BLOB)""")
    conn.execute("CREATE INDEX jobs_state ON jobs (state)")  # (state, seq): recovery, listings
    conn.execute(
        "CREATE UNIQUE INDEX jobs_key ON jobs (key) WHERE key IS NOT NULL AND state <> 'cancelled'"
    )
    conn.execute(
        "CREATE INDEX jobs_finished ON jobs (finished_wall) WHERE finished_wall IS NOT NULL"
    )


def _add_schedules_v2(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE schedules (
        schedule_id TEXT PRIMARY KEY, spec BLOB NOT NULL, state BLOB NOT NULL)""")


def _add_job_parents(conn: sqlite3.Connection) -> None:
    # The edges of jobs that wait for others (after=, ResultOf): one row per parent, kept
    # until the child leaves pending.
    conn.execute("""CREATE TABLE job_parents (
        job_id TEXT NOT NULL, parent_id TEXT NOT NULL, takes_result INTEGER NOT NULL,
        allow_failure INTEGER NOT NULL, PRIMARY KEY (job_id, parent_id))""")


def _add_retry_v3(conn: sqlite3.Connection) -> None:
    # A job with a retry policy: its policy, last error and notes (JSON,
    # mpsched._core.retrying.RetryState); NULL for every other job.
    conn.execute("ALTER TABLE jobs ADD COLUMN retry TEXT DEFAULT NULL")


def _add_progress(conn: sqlite3.Connection) -> None:
    """The latest progress a job reported (JSON text), written when a job that reported
    some ends: NULL for every other job."""
    conn.execute("ALTER TABLE jobs ADD COLUMN progress TEXT DEFAULT NULL")


def _add_queues_and_limits(conn: sqlite3.Connection) -> None:
    # NULL: the default queue, and no limit (old rows read so).
    conn.execute("ALTER TABLE jobs ADD COLUMN queue TEXT")
    conn.execute("ALTER TABLE jobs ADD COLUMN limit_name TEXT")
    conn.execute("CREATE TABLE limits (name TEXT PRIMARY KEY, form TEXT NOT NULL)")


# MIGRATIONS[v] takes a store from schema version v to v + 1, inside the opening
# transaction; version 0 is a new, empty file. Append a step for every schema change.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _create_v1,
    _add_schedules_v2,
    _add_retry_v3,
    _add_progress,
    _add_queues_and_limits,
    _add_job_parents,
]


def open_checked(path: str) -> int:
    """Check ``path`` can be a store without writing to it, then take its lock file.

    Returns the locked file descriptor. Raises StoreError or StoreLockedError.
    """
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise StoreError(path, f"its directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StoreError(
            path,
            f"its directory {directory} is not writable "
            "(the store needs its -wal, -shm and .lock files beside it)",
        )
    if os.path.isdir(path):
        raise StoreError(path, "is a directory")
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(path, "the file is not readable and writable")
    _schema_version(path)
    return _lock(path)


def _lock(path: str) -> int:
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(path, f"cannot create its lock file: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise StoreLockedError(path, int(text) if text.isdigit() else None) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _schema_version(path: str) -> int:
    """The schema version of the store at ``path``, read without writing: 0 for a new file.

    Raises StoreError for a file that is not an mpsched store or has a newer schema.
    """
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return 0
    with open(path, "rb") as file:
        if file.read(len(_HEADER)) != _HEADER:
            raise StoreError(
                path, "not an mpsched store (not an SQLite database); it was left untouched"
            )
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=2.0)
        try:
            return _read_version(conn, path)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise translate(exc, path) from exc


def _read_version(conn: sqlite3.Connection, path: str) -> int:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    if app_id == 0 and not tables:
        return 0
    if app_id != APPLICATION_ID or "meta" not in tables:
        raise StoreError(
            path,
            "not an mpsched store (an SQLite database of another program); it was left untouched",
        )
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    version = meta.get("schema_version")
    if meta.get("application") != "mpsched" or not isinstance(version, int) or version < 1:
        raise StoreError(path, f"not an mpsched store (meta {meta!r}); it was left untouched")
    if version > len(MIGRATIONS):
        raise StoreError(
            path,
            f"its schema version {version} is newer than this mpsched "
            f"knows ({len(MIGRATIONS)}): open it with a newer mpsched; "
            "it was left untouched",
        )
    return version


def connect_writer(path: str, durability: Durability) -> sqlite3.Connection:
    """The writer's connection, in WAL mode, with the schema migrated to the current one."""
    # cached_statements: every statement the writer runs stays prepared (a few dozen: its
    # multi-row ones take a power of two of rows, see execute_rows).
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=2.0, cached_statements=1024
    )
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(path, f"cannot use WAL mode (journal mode {mode})")
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
        conn.execute("PRAGMA cache_size = -65536")  # KiB: the indexes of ~1M jobs
        _migrate(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        raise translate(exc, path) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema to ``len(MIGRATIONS)``, all steps in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _read_version(conn, path)  # again: we hold the lock file now
        target = len(MIGRATIONS)
        if version == 0:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        for step in MIGRATIONS[version:]:
            step(conn)
        conn.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)",
            [("application", "mpsched"), ("schema_version", target)],
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if version not in (0, target):
        log.info("migrated the job store %s from schema %d to %d", path, version, target)
