"""The lease log: a lease, a requeue and a finish are journalled by one write each to a file
beside the store.

A job may be handed out only once its lease is journalled here, in ``PATH-leases``; its row
in SQLite follows in the writer's next batch. A finish carries the job's outcome when it is
up to ``OUTCOME_IN_LOG`` bytes; a larger one is committed to SQLite before the finish
returns. The file is a memory mapping of regions written full of zeros at open; a region is
written again only once every change logged there is committed to SQLite. With
``durability="sync"`` it is group-synced (:mod:`mpsched._store.group_sync`). At open, the
store folds the log into SQLite and empties it.

Why it is built so, and what each choice measured: docs/architecture.md, "The lease log".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable

from mpsched._errors import StoreError, StoreFullError
from mpsched._store.group_sync import GroupSync
from mpsched._store.lease_records import LogRecord, encode, frame, read_run

log = logging.getLogger("mpsched.store")

# Bytes of one region of the log (~2,300 leases); two at first. Part of the file's layout:
# a log is read with the region size it was written with.
LIMIT = 128 << 10
FLUSH_RETRY = 1.0  # seconds before the flusher tries again after a failed flush


class LeaseLog:
    """The log of leases and requeues at ``path``. Thread-safe.

    Args:
        path: the log file (created if missing, mode 0644).
        sync: fdatasync() the records written, from a thread of its own, at most every
            ``SYNC_INTERVAL`` (durability="sync"); until ``release``.
        flush: waits until every change queued to the store so far is committed (the
            store's writer); called by the flusher thread when a region is left.
        limit: bytes of one region (default ``LIMIT``): the longest record it takes.
    Raises:
        StoreError: the file could not be opened.
    """

    def __init__(
        self, path: str, *, sync: bool, flush: Callable[[], None], limit: int | None = None
    ) -> None:
        self.path = path
        self._flush = flush
        self._region = LIMIT if limit is None else limit
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(path, f"cannot open the lease log: {exc.strerror}") from None
        # Guards every field below but _syncer, and orders the appends: held for one
        # copy into the mapping and the caller's queueing of its SQLite change, or to grow
        # the file. Appenders wait on it; so does the flusher thread, through _flush_cond.
        self._lock = threading.Lock()
        self._size = 0  # where the next record goes (an offset in the file)
        self._end = 0  # the end of the region being written
        self._epoch = 0
        self._ticket = 0  # the last ticket written (copied into the mapping)
        self._closed = False
        # The file, mapped (from ``reset``); replaced when the log grows.
        self._map: mmap.mmap | None = None
        self._regions: deque[int] = deque()  # region numbers, oldest first; the last is written
        self._last: list[int] = []  # by region: the last ticket written there since reset
        self._committed = 0  # every change up to this ticket is committed (a flush ended)
        self._flush_wanted = 0  # the flusher is to make _committed reach this ticket
        self._flusher_stopping = False
        # On _lock. The flusher thread waits on it for _flush_wanted to pass _committed (a
        # region was left), or for FLUSH_RETRY after a failed flush; ``release`` wakes it.
        self._flush_cond = threading.Condition(self._lock)
        self._flusher = threading.Thread(
            target=self._flush_loop, daemon=True, name="mpsched-lease-flush"
        )
        self._flusher.start()
        # With ``sync``, the thread that fdatasync()s the records written (its own lock).
        self._syncer = GroupSync(self._fd, path) if sync else None

    def wait_synced(self, ticket: int, timeout: float) -> bool:
        """With ``sync``: wait until the record of ``ticket`` is on disk; False if it is not
        by ``timeout`` seconds (or without ``sync``)."""
        return self._syncer is not None and self._syncer.wait_synced(ticket, timeout)

    # ------------------------------------------------------------------ at open

    def read(self) -> list[LogRecord]:
        """The log's valid records, oldest first (which: the module's doc)."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        size = self._region
        runs = [run for at in range(0, len(data), size) if (run := read_run(data, at, at + size))]
        if not runs:
            return []
        # Region 0 takes the first record of every epoch (and reset() leaves no other
        # epoch's records on disk): its epoch, or if a record torn there hides it, the next.
        epoch = runs[0][0][0]
        found = {
            ticket: record
            for run in runs
            for run_epoch, ticket, record in run
            if run_epoch == epoch
        }
        return [found[ticket] for ticket in sorted(found)]

    def reset(self) -> None:
        """Empty the log (its records are folded into the store): two regions of zeros,
        on disk before this returns; a new epoch."""
        with self._lock:
            try:
                os.ftruncate(self._fd, 0)
            except OSError as exc:
                raise self._error(exc) from None
            self._grow_locked(2)
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise self._error(exc) from None
            self._size = 0
            self._end = self._region
            self._regions = deque([1, 0])  # 0 is written first; 1, empty, is the oldest
            self._last = [0, 0]
            self._committed = self._flush_wanted = 0
            self._epoch = int.from_bytes(os.urandom(8), "little")
            self._ticket = 0
            if self._syncer is not None:
                self._syncer.reset()

    # ------------------------------------------------------------------ appends

    def append(self, record: LogRecord, queue: Callable[[], None]) -> int:
        """Write ``record``, then run ``queue`` (which queues the matching change to the
        store), both under the lock; returns the record's ticket.

        Raises:
            StoreError: the log is closed, or it had to grow and could not
                (StoreFullError: no space), or the record is longer than a region;
                ``queue`` was not run. What ``queue`` raises (the record is wiped again).
        """
        encoded = encode(record)
        with self._lock:
            if self._closed or self._map is None:  # closed, or never reset (opened)
                raise StoreError(self.path, "the store is closed")
            ticket = self._ticket + 1
            data = frame(self._epoch, ticket, encoded)
            if self._size + len(data) > self._end:
                self._next_region_locked(len(data))
            start = self._size
            end = start + len(data)
            mapped = self._map
            mapped[start:end] = data
            try:
                queue()
            except BaseException:  # nothing will reach the store: neither may the record
                mapped[start:end] = bytes(len(data))
                raise
            self._size = end
            self._ticket = self._last[self._regions[-1]] = ticket
            if self._syncer is not None:
                self._syncer.written(ticket)
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
        with self._lock:
            self._flusher_stopping = True
            self._flush_cond.notify_all()
        self._flusher.join()
        if self._syncer is not None:
            self._syncer.stop()
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        with self._lock:
            if self._map is not None:
                self._map.close()
        os.close(self._fd)
        self._fd = -1

    # ------------------------------------------------------------------ inside

    def _flush_loop(self) -> None:
        """The flusher thread: when a region is left, flush the store's writer (outside the
        lock); then the regions written before the flush began may be written again."""
        with self._lock:
            while True:
                while self._flush_wanted <= self._committed and not self._flusher_stopping:
                    self._flush_cond.wait()
                if self._flusher_stopping:
                    return
                covered = self._ticket  # every change logged so far is queued to the store
                epoch = self._epoch
                self._lock.release()
                try:
                    self._flush()
                    flushed = True
                except StoreError:  # the writer logs why; the log grows meanwhile
                    flushed = False
                except Exception:  # a bug: the log grows, but the store goes on
                    log.exception("%s: the flush of the store failed", self.path)
                    flushed = False
                finally:
                    self._lock.acquire()
                if not flushed:
                    self._flush_cond.wait_for(lambda: self._flusher_stopping, FLUSH_RETRY)
                elif epoch == self._epoch:  # (after a reset, tickets start anew)
                    self._committed = max(self._committed, covered)

    def _next_region_locked(self, length: int) -> None:
        """Go on in the next region: the oldest if its changes are committed, else a new
        one at the end of the file. Asks the flusher for the region left behind.

        Raises:
            StoreError: the record is longer than a region, or the log could not grow
                (StoreFullError: no space); nothing changed.
        """
        if length > self._region:
            raise StoreError(
                self.path,
                f"a record of {length} bytes is longer than a region "
                f"of the lease log ({self._region} bytes)",
            )
        oldest = self._regions[0]
        if self._last[oldest] <= self._committed:
            self._regions.popleft()
            region = oldest
        else:
            region = len(self._last)
            self._grow_locked(region + 1)
            self._last.append(0)
        self._regions.append(region)
        self._last[region] = 0
        self._size = region * self._region
        self._end = self._size + self._region
        self._flush_wanted = self._ticket
        self._flush_cond.notify()

    def _grow_locked(self, regions: int) -> None:
        """Make the file ``regions`` regions long, zeros written past its end (no hole to
        fault in), and map it all."""
        size = os.fstat(self._fd).st_size
        zeros = bytes(regions * self._region - size)
        try:
            if os.pwrite(self._fd, zeros, size) != len(zeros):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            mapped = mmap.mmap(self._fd, regions * self._region)
        except OSError as exc:
            raise self._error(exc) from None
        if self._map is not None:
            self._map.close()
        self._map = mapped

    def _error(self, exc: OSError) -> StoreError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFullError(self.path)
        return StoreError(self.path, f"the lease log could not be written: {exc.strerror}")
