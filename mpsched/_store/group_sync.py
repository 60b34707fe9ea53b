"""GroupSync: a thread that fdatasync()s a file whatever was written to it since its last
sync, at most every ``SYNC_INTERVAL``, and at once after a quiet spell (the lease log's
``durability="sync"``, mpsched._store.lease_log).

Writers number what they write (tickets, one more per record) and say so
(:meth:`GroupSync.written`); nobody waits for a sync but those that ask to
(:meth:`GroupSync.wait_synced`). A failed fdatasync() is logged once and tried again every
``SYNC_BACKOFF`` until it works.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("mpsched.store")

# Seconds from one fdatasync() of a busy log to the next (durability="sync"): the most a
# power cut may take back. At ~50 µs of kernel CPU each, a busy log costs ~2% of a core.
SYNC_INTERVAL = 0.002
SYNC_BACKOFF = 1.0  # seconds between tries after an fdatasync() failed


class GroupSync:
    """Syncs the file ``fd`` (named ``path`` in logs) from a thread of its own, from
    construction until :meth:`stop`."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self._path = path
        # Guards _written, _synced, _idle and _stopping. The syncer thread waits on it for
        # records to sync (written() notifies it when it is idle) and, between two syncs,
        # for stop(); wait_synced() callers wait for a sync. Taken after the lease log's
        # own lock, never before it.
        self._cond = threading.Condition(threading.Lock())
        self._written = 0  # the last ticket written, as the syncer sees it
        self._synced = 0  # the last ticket an fdatasync() that began after its write covered
        self._idle = False
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="mpsched-lease-sync")
        self._thread.start()

    def written(self, ticket: int) -> None:
        """Every record up to ``ticket`` is written: the next sync covers it."""
        with self._cond:
            self._written = ticket
            if self._idle:
                self._cond.notify_all()

    def reset(self) -> None:
        """Tickets start again from 1 (the file was emptied, and synced)."""
        with self._cond:
            self._written = self._synced = 0

    def wait_synced(self, ticket: int, timeout: float) -> bool:
        """Wait until the record of ``ticket`` is on disk; False if it is not by
        ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._synced >= ticket, timeout)

    def stop(self) -> None:
        """Sync what is left, and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        """The syncer thread: fdatasync() what was written, at most every SYNC_INTERVAL,
        until ``stop`` and nothing is left. A failure is logged and tried again."""
        failing = False
        while True:
            with self._cond:
                self._idle = True
                while self._written <= self._synced and not self._stopping:
                    self._cond.wait()
                self._idle = False
                if self._written <= self._synced:
                    return  # stopping, and all of it is on disk
                covered = self._written
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                if not failing:
                    log.error(
                        "%s: fdatasync() failed (%s): the leases since its last "
                        "success may not survive a power cut; trying again",
                        self._path,
                        exc.strerror,
                    )
                failing = True
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopping, SYNC_BACKOFF):
                        return
                continue
            if failing:
                log.warning("%s: fdatasync() works again", self._path)
                failing = False
            with self._cond:
                self._synced = max(self._synced, covered)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._stopping, SYNC_INTERVAL)
