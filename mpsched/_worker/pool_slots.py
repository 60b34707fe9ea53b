"""The claim slots of a worker pool's remote workers, in a file of this user's runtime
directory, so that what they record outlives them and the pool.

A remote worker records in its slot (mpsched._worker.claims) the job it enters and keeps
there each report until its manager has it, under the id it joined with. When a worker
dies, its pool reads the slot and tells the manager what it left (ManagerService.
worker_exited): a job it ran to its end ends with its outcome, the job it was in is lost
with it, and a job it never entered goes back to the queue untouched. The file is
``pool-KEY-PID.workers`` (KEY names the manager's address), locked by its pool for its life
(flock): a pool that starts takes the files of this manager's pools that died (SIGKILL,
their lock gone with them), tells the manager what their slots say once it reaches it,
and then removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, NamedTuple

from mpsched._protocol.records import LeftBehind
from mpsched._transport.address import format_address
from mpsched._transport.runtime import open_runtime_dir
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.slot_file import SlotFile, read_traces

log = logging.getLogger("mpsched.remote")


class Orphan(NamedTuple):
    """The slot file of a pool that died, held (locked) by this pool until told."""

    path: Path
    fd: int  # holds its lock
    left: dict[str, LeftBehind]  # what its slots say, by worker id


class PoolSlots:
    """One pool's slot file (or, where there is no runtime directory, anonymous slots).
    Used from the pool's main thread only."""

    def __init__(self, address: Any, directory: Path | None = None) -> None:
        """``directory``: where the file goes; by default this user's runtime directory."""
        if directory is None:
            with contextlib.suppress(Exception):
                directory = open_runtime_dir(create=True)
        key = hashlib.sha256(format_address(address).encode()).hexdigest()[:16]
        self._file: SlotFile | None = None
        self._lock_fd = -1
        # First: a file of a dead pool may have this pool's pid in its name.
        self.orphans = [] if directory is None else _orphans(directory, key)
        if directory is not None:
            self._open(directory / f"pool-{key}-{os.getpid()}.workers")

    def _open(self, path: Path) -> None:
        try:
            self._file = SlotFile(str(path))
            self._lock_fd = os.open(path, os.O_RDONLY)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            log.warning(
                "no slot file for this pool's workers (%s): what a worker that dies "
                "ran to its end but did not report is taken for crashed",
                exc,
            )
            self._close_lock()
            self._file = None

    def slot(self, ctx: BaseContext) -> ClaimSlot:
        """A slot for a worker about to start (it names it with each id it joins under)."""
        return ClaimSlot(ctx) if self._file is None else self._file.slot(ctx, "")

    def release(self, slot: ClaimSlot) -> None:
        """``slot``'s worker has exited and the manager was told what it left."""
        if self._file is not None:
            self._file.release(slot)

    def close(self) -> None:
        """The pool exits with every worker gone and told: the file goes."""
        if self._file is not None:
            self._file.remove()
        self._close_lock()

    def _close_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def forget(orphan: Orphan) -> None:
    """The manager was told what ``orphan`` says: remove it."""
    with contextlib.suppress(OSError):
        orphan.path.unlink()
    os.close(orphan.fd)


def _orphans(directory: Path, key: str) -> list[Orphan]:
    """The slot files of this manager's pools that died, each locked, with what it says."""
    found = []
    for path in sorted(directory.glob(f"pool-{key}-*.workers")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its pool runs
            found.append(Orphan(path, fd, read_traces(str(path))))
        except OSError:
            os.close(fd)
    return found
