"""The lease log: a lease is journalled by one write to a file beside the store.

A job may be handed out only once its lease is journalled (a job taken before a crash must
come back as running, never as pending). A commit of SQLite per lease cost ~35 µs of CPU
even without an fsync, and dispatch did little else; a record here costs ~2 µs
(``benchmarks/bench_store_steps.py``). So a lease is written to ``PATH-leases`` before the
job is handed out, while its row in SQLite is updated asynchronously, in the writer's next
batch. A requeue, the other change that moves a job between pending and running, is logged
too, so that the log holds every such change in order. The file is mapped into memory and a
record is copied in: it is in the kernel's page cache at once, so it survives a crash of the
manager process, and the copy keeps the GIL (a pwrite() per record let go of it, and under
load each lease then waited to get it back: the manager's CPU per job in the durable
dispatch benchmark fell by ~15 µs without it).

With ``durability="sync"`` the log is also group-synced: a thread of its own fdatasync()s
whatever was written since its last one, at most every ``SYNC_INTERVAL`` (2 ms), and at once
after a quiet spell. A lease reaches the disk within ~2 ms, as the SQLite journal's group
commit does for finishes; a job is not held back for it (an fdatasync per lease put a device
flush in every worker's cycle, and held dispatch to ~0.35x of no store). A power cut may
thus forget the leases of its last ~2 ms: those jobs come back pending, their attempt not
counted.

Each record carries the job's state after the change: running on a worker as attempt A, or
pending after A attempts. So the last record of a job is its state, unless SQLite has the
job finished or cancelled (states a job never leaves). At open, before anything else, the
store folds the log into SQLite that way (``read``, then one commit) and empties it.

The file is written full of zeros once, at open, and records overwrite it from the start: no
page of the mapping is a hole (a full disk would then kill the process at the copy), and an
fdatasync() (which on Linux covers what was copied into a shared mapping) flushes data only,
never a change of the file's size. Once ``limit`` bytes are written, the next record first
flushes the store's writer (every logged change is then committed to SQLite: the caller
queues its SQLite change under this log's lock, right with its record) and starts again at
offset 0.

Reading stops at the first record that is torn, fails its CRC32, or breaks the order: a
record carries the log's epoch (new at every open) and a ticket (one more per record), so
the records a restart at offset 0 left behind the new ones (lower tickets), those of an
earlier manager (another epoch), and whatever a power cut left after the last fdatasync()
are never read. If the store cannot commit, the log grows on (zeros written past the end,
then mapped); a record that finds no room there is refused (StoreFullError).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Callable
from typing import NamedTuple

from mpsched._errors import StoreError, StoreFullError

log = logging.getLogger("mpsched.store")

LIMIT = 256 << 10  # bytes of log (~4,500 leases) before it starts again at 0, after a flush
SLACK = 16 << 10  # zeros beyond LIMIT: room for records written before a restart
# Seconds from one fdatasync() of a busy log to the next (durability="sync"): the most a
# power cut may take back. At ~50 µs of kernel CPU each, a busy log costs ~2% of a core.
SYNC_INTERVAL = 0.002
SYNC_BACKOFF = 1.0  # seconds between tries after an fdatasync() failed

_HEAD = struct.Struct("<IH")  # CRC32 of the body, body length
_BODY = struct.Struct("<QQIBH")  # epoch, ticket, attempt, running (0/1), job id length


class LogRecord(NamedTuple):
    """A job's state after a lease (running) or a requeue (pending)."""

    job_id: str
    running: bool
    attempt: int
    worker_id: str | None  # the worker it is leased to; None when pending


def latest(records: list[LogRecord]) -> dict[str, LogRecord]:
    """The last record of each job in ``records`` (oldest first): the job's state."""
    return {record.job_id: record for record in records}


class LeaseLog:
    """The log of leases and requeues at ``path``. Thread-safe.

    Args:
        path: the log file (created if missing, mode 0644).
        sync: fdatasync() the records written, from a thread of its own, at most every
            ``SYNC_INTERVAL`` (durability="sync"); until ``release``.
        flush: waits until every change queued to the store so far is committed (the
            store's writer); called before writing starts again at offset 0.
        limit: bytes after which the next append starts again at offset 0 (default
            ``LIMIT``).
    Raises:
        StoreError: the file could not be opened.
    """

    def __init__(self, path: str, *, sync: bool, flush: Callable[[], None],
                 limit: int | None = None) -> None:
        self.path = path
        self._flush = flush
        self._limit = LIMIT if limit is None else limit
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(path, f"cannot open the lease log: {exc.strerror}") from None
        # Guards _size, _trim_at, _epoch, _ticket, _closed and _map, and orders the appends:
        # held for one copy into the mapping and the caller's queueing of its SQLite change,
        # or for a flush when writing starts again at offset 0. Appenders wait on it.
        self._lock = threading.Lock()
        self._size = 0  # where the next record goes: the end of the last one written
        self._trim_at = self._limit
        self._epoch = 0
        self._ticket = 0  # the last ticket written (copied into the mapping)
        self._closed = False
        # The file, mapped (from ``reset``); replaced when the log grows.
        self._map: mmap.mmap | None = None
        # Guards _written, _synced, _syncer_idle and _stopping; taken after _lock. The syncer
        # thread waits on it for records to sync (appends notify it when it is idle) and,
        # between two syncs, for ``release``; ``wait_synced`` callers wait for a sync.
        self._sync_cond = threading.Condition(threading.Lock())
        self._written = 0  # the last ticket written, as the syncer sees it
        self._synced = 0  # the last ticket an fdatasync() that began after its write covered
        self._syncer_idle = False
        self._stopping = False
        self._syncer: threading.Thread | None = None
        if sync:
            self._syncer = threading.Thread(target=self._sync_loop, daemon=True,
                                            name="mpsched-lease-sync")
            self._syncer.start()

    def wait_synced(self, ticket: int, timeout: float) -> bool:
        """With ``sync``: wait until the record of ``ticket`` is on disk; False if it is not
        by ``timeout`` seconds (or without ``sync``)."""
        if self._syncer is None:
            return False
        with self._sync_cond:
            return self._sync_cond.wait_for(lambda: self._synced >= ticket, timeout)

    # ------------------------------------------------------------------ at open

    def read(self) -> list[LogRecord]:
        """The log's valid records, oldest first (where reading stops: the module's doc)."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        records: list[LogRecord] = []
        epoch = ticket = None
        at = 0
        while at + _HEAD.size <= len(data):
            crc, length = _HEAD.unpack_from(data, at)
            body = data[at + _HEAD.size:at + _HEAD.size + length]
            if length < _BODY.size or len(body) < length or zlib.crc32(body) != crc:
                break
            rec_epoch, rec_ticket, attempt, running, id_len = _BODY.unpack_from(body)
            if (epoch is not None and rec_epoch != epoch) or \
                    (ticket is not None and rec_ticket <= ticket) or \
                    _BODY.size + id_len > length:
                break
            epoch, ticket = rec_epoch, rec_ticket
            job_id = body[_BODY.size:_BODY.size + id_len].decode()
            worker = body[_BODY.size + id_len:].decode() if running else None
            records.append(LogRecord(job_id, bool(running), attempt, worker))
            at += _HEAD.size + length
        return records

    def reset(self) -> None:
        """Empty the log (its records are folded into the store): zeros over ``limit``
        bytes and some room, on disk before this returns; a new epoch."""
        zeros = bytes(self._limit + SLACK)
        with self._lock:
            try:
                os.ftruncate(self._fd, 0)
                if os.pwrite(self._fd, zeros, 0) != len(zeros):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(self._fd)
            except OSError as exc:
                raise self._error(exc) from None
            self._map_locked(len(zeros))
            self._size = 0
            self._trim_at = self._limit
            self._epoch = int.from_bytes(os.urandom(8), "little")
            self._ticket = 0
            with self._sync_cond:
                self._written = self._synced = 0

    # ------------------------------------------------------------------ appends

    def append(self, record: LogRecord, queue: Callable[[], None]) -> int:
        """Write ``record``, then run ``queue`` (which queues the matching change to the
        store), both under the lock; returns the record's ticket.

        Raises:
            StoreError: the log is closed, or it had to grow and could not
                (StoreFullError: no space); ``queue`` was not run. What ``queue`` raises
                (the record is wiped again).
        """
        job_id = record.job_id.encode()
        worker = (record.worker_id or "").encode() if record.running else b""
        with self._lock:
            if self._closed or self._map is None:  # closed, or never reset (opened)
                raise StoreError(self.path, "the store is closed")
            if self._size >= self._trim_at:
                self._restart_locked()
            ticket = self._ticket + 1
            body = _BODY.pack(self._epoch, ticket, record.attempt, record.running,
                              len(job_id)) + job_id + worker
            data = _HEAD.pack(zlib.crc32(body), len(body)) + body
            end = self._size + len(data)
            mapped = self._map if end <= len(self._map) else self._grow_locked(end)
            mapped[self._size:end] = data
            try:
                queue()
            except BaseException:  # nothing will reach the store: neither may the record
                mapped[self._size:end] = bytes(len(data))
                raise
            self._size = end
            self._ticket = ticket
            if self._syncer is not None:
                with self._sync_cond:
                    self._written = ticket
                    if self._syncer_idle:
                        self._sync_cond.notify_all()
        return ticket

    def close(self) -> None:
        """Refuse further appends (the store is closing)."""
        with self._lock:
            self._closed = True

    def release(self, remove: bool) -> None:
        """Sync what is left (with ``sync``) and close the file; ``remove`` it when every
        logged change is in the store. Once: later calls do nothing."""
        if self._fd < 0:
            return
        if self._syncer is not None:
            with self._sync_cond:
                self._stopping = True
                self._sync_cond.notify_all()
            self._syncer.join()
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        with self._lock:
            if self._map is not None:
                self._map.close()
        os.close(self._fd)
        self._fd = -1

    # ------------------------------------------------------------------ inside

    def _sync_loop(self) -> None:
        """The syncer thread: fdatasync() what was written, at most every SYNC_INTERVAL,
        until ``release`` and nothing is left. A failure is logged and tried again."""
        failing = False
        while True:
            with self._sync_cond:
                self._syncer_idle = True
                while self._written <= self._synced and not self._stopping:
                    self._sync_cond.wait()
                self._syncer_idle = False
                if self._written <= self._synced:
                    return  # stopping, and all of it is on disk
                covered = self._written
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                if not failing:
                    log.error("%s: fdatasync() failed (%s): the leases since its last "
                              "success may not survive a power cut; trying again",
                              self.path, exc.strerror)
                failing = True
                with self._sync_cond:
                    if self._sync_cond.wait_for(lambda: self._stopping, SYNC_BACKOFF):
                        return
                continue
            if failing:
                log.warning("%s: fdatasync() works again", self.path)
                failing = False
            with self._sync_cond:
                self._synced = max(self._synced, covered)
                self._sync_cond.notify_all()
                self._sync_cond.wait_for(lambda: self._stopping, SYNC_INTERVAL)

    def _restart_locked(self) -> None:
        """Flush the store's writer, then write on from offset 0; if the flush fails, grow
        on and try again after another ``limit`` bytes."""
        try:
            self._flush()
        except StoreError:
            self._trim_at = self._size + self._limit
            return
        self._size = 0
        self._trim_at = self._limit

    def _map_locked(self, length: int) -> mmap.mmap:
        """Map the file's first ``length`` bytes (written already: no hole to fault in)."""
        try:
            mapped = mmap.mmap(self._fd, length)
        except OSError as exc:
            raise self._error(exc) from None
        if self._map is not None:
            self._map.close()
        self._map = mapped
        return mapped

    def _grow_locked(self, end: int) -> mmap.mmap:
        """Make the file reach past ``end``, zeros written beyond what is mapped (the log
        grows while its changes cannot be committed), and map it all."""
        mapped = os.fstat(self._fd).st_size
        zeros = bytes(end + SLACK - mapped)
        try:
            if os.pwrite(self._fd, zeros, mapped) != len(zeros):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise self._error(exc) from None
        return self._map_locked(end + SLACK)

    def _error(self, exc: OSError) -> StoreError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFullError(self.path)
        return StoreError(self.path, f"the lease log could not be written: {exc.strerror}")
