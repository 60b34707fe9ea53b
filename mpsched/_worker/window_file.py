"""WindowFile: a run window's rows and its lock, in a file that a manager and its local
workers each map (docs/design/run-window.md; the rules are mpsched._core.run_window's).

Not used yet: steps 2 and 3 of the design page build on it.

The file holds the window's head, then ``capacity`` entries, then ``capacity`` claims,
each a fixed record of int64 and float64 values. Every process maps it shared, so a write
is seen by the others at once; being a file, it can live beside a SQLite store and outlive
the processes, as the slot file does (mpsched._worker.slot_file).

The lock is a ``flock`` on the file, which the kernel drops when its holder dies: a worker
killed inside a claim does not leave the window locked, as it would a POSIX semaphore.
A ``flock`` belongs to an open file description, so each process opens the file itself;
threads of one process share it, so a thread lock serialises them first.

A worker with nothing due sleeps on a futex on the head's ``generation`` (its low 32 bits)
until the first entry is due (:meth:`WindowFile.sleep`); whoever moves ``generation``
wakes every sleeper (:meth:`WindowFile.wake_all`). The kernel compares the word before it
sleeps, so a move made after the worker looked is never missed.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import struct
import threading
import time
from typing import Any

from mpsched._core.run_window import Claim, Entry, Head

# ready first, ready count, claims first, claims count, generation, sweep by, backlog
_HEAD = struct.Struct("=qqqqqd?")
_ENTRY = struct.Struct("=qdqq")  # lease id, due, level, seq
_CLAIM = struct.Struct("=qqd")  # lease id, taker, started
HEAD_BYTES = 64
_GENERATION = 32  # the offset of the head's generation (the fifth int64)

# futex(2): its system call number by machine (the same on every Linux of that machine);
# a wait and a wake between processes (not FUTEX_PRIVATE_FLAG).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "riscv64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 2**31 - 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # its functions let go of the GIL
# Elsewhere a sleeper looks again this often instead (no futex number known here).
POLL = 0.001


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def window_bytes(capacity: int) -> int:
    """The size of a window file of ``capacity`` rows."""
    return HEAD_BYTES + capacity * (_ENTRY.size + _CLAIM.size)


class WindowLock:
    """The window's lock, for the threads of this process and every other process that
    opened the file. Re-entered by none: each hold is a few reads and writes."""

    def __init__(self, path: str) -> None:
        self._reset(path)

    def _reset(self, path: str) -> None:
        self._path = path
        # Serialises this process's threads: a flock does not (they share its file).
        self._threads = threading.Lock()
        self._fd = -1
        self._pid = -1  # the process that opened _fd: a forked child opens its own

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            if self._pid != os.getpid():
                self._fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
                self._pid = os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def close(self) -> None:
        """Close this process's file (the lock must not be held)."""
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reset(state["path"])


class WindowFile:
    """A run window's rows (``mpsched._core.run_window.WindowRows``) and lock in one file.
    Picklable to a process it starts, which maps the file again by its path."""

    def __init__(self, path: str, capacity: int, *, create: bool = False) -> None:
        """Map the window file at ``path``; with ``create``, make it (0600) and empty it.

        Raises:
            ValueError: ``capacity`` is below 1, or the file is too small for it.
        """
        self._open(path, capacity, create=create)

    def _open(self, path: str, capacity: int, *, create: bool) -> None:
        if capacity < 1:
            raise ValueError(f"a window holds at least one entry, not {capacity}")
        self.path = path
        self._capacity = capacity
        size = window_bytes(capacity)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"{path} holds no window of {capacity} rows")
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        self._word = ctypes.c_uint32.from_buffer(self._map, _GENERATION)  # the futex
        self._futex = ctypes.c_void_p(ctypes.addressof(self._word))
        self._entries = HEAD_BYTES
        self._claims = HEAD_BYTES + capacity * _ENTRY.size
        self.lock = WindowLock(path)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "capacity": self._capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(state["path"], state["capacity"], create=False)

    def close(self) -> None:
        """Unmap the file and close the lock's (the window must not be in use here)."""
        self.lock.close()
        del self._word, self._futex  # the word holds the mapping open
        self._view.release()
        self._map.close()

    # -------------------------------------------------------------- sleeping

    def sleep(self, generation: int, timeout: float) -> None:
        """Wait, without the lock, until the head's ``generation`` has moved on from
        ``generation`` or ``timeout`` seconds have passed; it may return sooner
        (mpsched._core.run_window.Sleeper)."""
        if timeout <= 0:
            return
        if _SYS_FUTEX is None:
            time.sleep(min(timeout, POLL))
            return
        seconds = int(timeout)
        wait = _Timespec(seconds, int((timeout - seconds) * 1e9))
        expected = ctypes.c_uint32(generation & 0xFFFFFFFF)
        _LIBC.syscall(_SYS_FUTEX, self._futex, _FUTEX_WAIT, expected, ctypes.byref(wait), None, 0)

    def wake_all(self) -> None:
        """Wake every worker asleep in :meth:`sleep`: call it after moving ``generation``."""
        if _SYS_FUTEX is not None:
            _LIBC.syscall(_SYS_FUTEX, self._futex, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    # -------------------------------------------------------------- WindowRows

    @property
    def capacity(self) -> int:
        return self._capacity

    def head(self) -> Head:
        return Head._make(_HEAD.unpack_from(self._view, 0))

    def set_head(self, head: Head) -> None:
        _HEAD.pack_into(self._view, 0, *head)

    def entry(self, index: int) -> Entry:
        return Entry._make(_ENTRY.unpack_from(self._view, self._entries + index * _ENTRY.size))

    def set_entry(self, index: int, entry: Entry) -> None:
        _ENTRY.pack_into(self._view, self._entries + index * _ENTRY.size, *entry)

    def claim(self, index: int) -> Claim:
        return Claim._make(_CLAIM.unpack_from(self._view, self._claims + index * _CLAIM.size))

    def set_claim(self, index: int, claim: Claim) -> None:
        _CLAIM.pack_into(self._view, self._claims + index * _CLAIM.size, *claim)
