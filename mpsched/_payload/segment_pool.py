"""A client's reusable shared-memory segments for job arguments (see mpsched._payload.shm).

Creating a segment per job costs more than the copy into it: the kernel allocates and
zeroes fresh tmpfs pages on the first write into a new segment (measured on a small VM:
~0.9 ms a MiB, against ~0.1 ms to overwrite pages a segment already has) and frees them
again at unlink. So a client keeps the segments of its finished jobs for a while and
writes the next job's arguments into one of them.

Only segments whose buffers are all read-only are reused: a worker copies those out
(``bytes``) before the job runs and keeps no reference into the segment, so overwriting it
once the job has ended changes nothing the job could see. Writable buffers (NumPy arrays,
``bytearray``) are mapped copy-on-write by the worker, whose views would see later writes:
they still get a segment of their own, which the manager unlinks when the job ends.

Ownership (mpsched._payload.segments has the manager's side). A reusable segment is named
``<prefix>jp<client id>_<n>`` (:func:`mpsched._payload.shm.pool_stem`). While free it is the
client's; from the submit that carries it until its job ends it is the job's, held by the
manager, which at the end does not unlink it but leaves it to the client: the client
learns that the job ended from its outcome, or from the answer to its cancel, and calls
:meth:`SegmentPool.returned`. The client unlinks a segment that stayed free for
``IDLE`` seconds, or when more than ``MAX_FREE`` bytes are free, and every free one when it
closes. When a client goes away, the manager unlinks each of its reusable segments that no
job holds, and the others as their jobs end.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from mpsched._core.job import Payload
from mpsched._payload import frames, shm

log = logging.getLogger("mpsched.shm")

MAX_SIZE = 32 << 20  # arguments larger than this get a segment of their own
MAX_FREE = 64 << 20  # bytes of free segments a client keeps at most
IDLE = 1.0  # seconds a free segment is kept for the next job
_SMALLEST = 1 << 16  # size classes are powers of two from here up to MAX_SIZE

Stored = tuple[str, int, tuple[frames.BufferEntry, ...]]  # segment name, size, buffer table


class SegmentPool:
    """The reusable segments of one client of the manager whose prefix is ``prefix``."""

    def __init__(
        self,
        prefix: str,
        client_id: str,
        *,
        max_size: int = MAX_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_size``: the largest arguments (in bytes) written to a reusable segment
        (0: none, every job gets a segment of its own); ``clock`` measures ``IDLE``."""
        self.prefix = prefix
        self._max_size = max_size
        self._stem = shm.pool_stem(prefix, client_id)
        self._numbers = itertools.count(1)
        self._clock = clock
        # Guards the tables below. Submitting threads, the result thread and the sender
        # thread take it briefly, never across a write or an unlink; nobody waits on it.
        self._lock = threading.Lock()
        self._extent: dict[str, int] = {}  # every segment of this pool -> bytes it holds
        # Free segments by size class, least recently freed first, with when each was freed.
        self._free: dict[int, list[tuple[str, float]]] = {}
        self._free_bytes = 0
        self._closed = False

    def store(self, buffers: Sequence[memoryview]) -> Stored | None:
        """Write a job's out-of-band buffers into a segment: a free one of this pool when
        they are all read-only and small enough, else a new one (a segment of its own when
        it cannot be reused). None when shared memory cannot take them."""
        size = frames.layout(buffers)[0]
        if size > self._max_size or not all(buffer.readonly for buffer in buffers):
            return write_as(shm.new_name(self.prefix, "j"), buffers)
        while (free := self._take(_size_class(size))) is not None:
            written = shm.write(free, buffers, reuse=True)
            if written is not None:
                self._grown(free, size)
                return (free, *written)
            self._forget(free)  # removed under us, or shared memory is short
        stored = write_as(f"{self._stem}{next(self._numbers)}", buffers)
        if stored is not None:
            self._grown(stored[0], size)
        return stored

    def pooled(self, payload: Payload) -> str:
        """The segment of this pool that ``payload`` holds; "" for none."""
        name = frames.segment_of(payload)
        return name if name.startswith(self._stem) else ""

    def returned(self, name: str) -> None:
        """The job that held segment ``name`` (of this pool) has ended: it is free again,
        or unlinked when the pool keeps enough (or is closed)."""
        with self._lock:
            extent = self._extent.get(name, 0)
            keep = bool(extent) and not self._closed and self._free_bytes + extent <= MAX_FREE
            if keep:
                self._free.setdefault(_size_class(extent), []).append((name, self._clock()))
                self._free_bytes += extent
            else:
                self._extent.pop(name, None)
        if not keep:
            shm.unlink(name)

    def discard(self, name: str) -> None:
        """Unlink segment ``name`` (of this pool or not): its job was never taken."""
        self._forget(name)
        shm.unlink(name)

    def trim(self) -> float:
        """Unlink the segments free for ``IDLE`` seconds; returns the seconds until the
        next one will have been (infinity when none is free)."""
        now = self._clock()
        expired: list[str] = []
        next_due = float("inf")
        with self._lock:
            for free in self._free.values():
                while free and free[0][1] + IDLE <= now:
                    expired.append(free.pop(0)[0])
                if free:
                    next_due = min(next_due, free[0][1] + IDLE - now)
            for name in expired:
                self._free_bytes -= self._extent.pop(name)
        for name in expired:
            shm.unlink(name)
        return next_due

    def free_names(self) -> list[str]:
        """The free segments, for tests and listings."""
        with self._lock:
            return [name for free in self._free.values() for name, _ in free]

    def close(self) -> None:
        """Unlink the free segments; those still held by jobs are the manager's to unlink."""
        with self._lock:
            self._closed = True
            free = [name for entries in self._free.values() for name, _ in entries]
            self._free.clear()
            self._free_bytes = 0
            for name in free:
                del self._extent[name]
        for name in free:
            shm.unlink(name)

    def _take(self, size_class: int) -> str | None:
        with self._lock:
            free = self._free.get(size_class)
            if not free:
                return None
            name = free.pop()[0]  # the most recently used: its pages are likely cached
            self._free_bytes -= self._extent[name]
            return name

    def _grown(self, name: str, size: int) -> None:
        with self._lock:
            self._extent[name] = max(size, self._extent.get(name, 0))

    def _forget(self, name: str) -> None:
        with self._lock:
            self._extent.pop(name, None)


def _size_class(size: int) -> int:
    """The power of two (at least 64 KiB) that ``size`` bytes round up to."""
    return max(_SMALLEST, 1 << (size - 1).bit_length())


def write_as(name: str, buffers: Sequence[memoryview]) -> Stored | None:
    """Create segment ``name`` holding ``buffers``; None when shared memory cannot."""
    written = shm.write(name, buffers)
    return None if written is None else (name, *written)
