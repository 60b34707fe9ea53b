"""Where a manager's local workers get their claim slots (mpsched._worker.claims): anonymous
shared memory without a SQLite store, a file beside it with one.

The file, ``PATH-workers``, holds one slot of SLOT_SPAN bytes per local worker: which job it
started last and the reports it has not seen reach its manager. Being a file, it outlives
the manager's whole process tree (a SIGKILL of its process group, an OOM kill, a crash), as
the store's lease log does. A manager started again on the store reads it
(:meth:`SlotFile.traces`) before it resolves the jobs that were running, then empties it;
one that stops cleanly removes it. A slot is written again only for a worker started after
the one before it in that slot was resolved.

A slot's bytes reach the kernel's page cache at once and survive a crash of the processes,
not a power cut (nothing fsyncs them): after one, the jobs that were running are resolved
as without the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from multiprocessing.context import BaseContext
from typing import Protocol

from mpsched._protocol.records import LeftBehind
from mpsched._worker.claims import SLOT_BYTES, SLOT_SPAN, ClaimSlot, read_left, read_owner

log = logging.getLogger("mpsched.supervisor")


class SlotSource(Protocol):
    """What the supervisor gets each local worker's claim slot from."""

    def slot(self, ctx: BaseContext, worker_id: str) -> ClaimSlot:
        """A slot for a worker about to start."""

    def release(self, slot: ClaimSlot) -> None:
        """``slot``'s worker has exited and what it held is resolved."""


class AnonymousSlots:
    """Slots in anonymous shared memory: a manager without a SQLite store."""

    def slot(self, ctx: BaseContext, worker_id: str) -> ClaimSlot:
        return ClaimSlot(ctx)

    def release(self, slot: ClaimSlot) -> None:
        pass


class SlotFile:
    """The slots of one manager's local workers in ``PATH-workers``. The manager holds the
    store's lock, so no other process writes the file but its own workers. Its methods are
    called from the manager's main thread only."""

    def __init__(self, path: str) -> None:
        """``path``: the file (created 0600 if missing), a store's ``PATH-workers``."""
        self.path = path
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        self._slots = 0  # slots the file holds, each written full of zeros once
        self._free: list[int] = []  # of those, the ones no worker uses
        self._full = False  # the file could not grow: said once

    def traces(self) -> dict[str, LeftBehind]:
        """What each slot says its worker left of its jobs, by worker id: read before
        their leases are resolved."""
        return read_traces(self.path)

    def clear(self) -> None:
        """Forget every slot (their workers' jobs are resolved)."""
        os.truncate(self.path, 0)
        self._slots, self._free = 0, []

    def slot(self, ctx: BaseContext, worker_id: str) -> ClaimSlot:
        index = self._free.pop() if self._free else self._grow()
        if index is None:
            return ClaimSlot(ctx)
        slot = ClaimSlot(ctx, (self.path, index))
        slot.name(worker_id)
        return slot

    def release(self, slot: ClaimSlot) -> None:
        if slot.region is not None:
            self._free.append(slot.region[1])

    def remove(self) -> None:
        """The manager stopped cleanly: no worker is left, nothing is running."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _grow(self) -> int | None:
        """One more slot at the end of the file, written full of zeros (a hole in a shared
        mapping would kill the worker at its first write on a full disk); None if the
        file cannot grow: that worker's slot is anonymous."""
        index = self._slots
        try:
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.pwrite(fd, bytes(SLOT_SPAN), index * SLOT_SPAN)
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._full:
                self._full = True
                log.warning(
                    "could not grow %s (%s); a worker started now keeps its reports "
                    "in memory only: a job it runs when the manager dies may be "
                    "taken for crashed",
                    self.path,
                    exc,
                )
            return None
        self._slots += 1
        return index


def read_traces(path: str) -> dict[str, LeftBehind]:
    """What each slot of the slot file at ``path`` says its worker left, by worker id."""
    with open(path, "rb") as file:
        data = memoryview(file.read())
    traces = {}
    for at in range(0, len(data) - SLOT_BYTES + 1, SLOT_SPAN):
        view = data[at : at + SLOT_BYTES]
        worker_id = read_owner(view)
        if worker_id:
            traces[worker_id] = read_left(view)
    return traces
