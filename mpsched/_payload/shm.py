"""Shared-memory segments that carry a job's large buffers: their names, writing, reading
and removing them.

A client that shares the manager's ``/dev/shm`` writes a job's large buffers (pickle
protocol 5, out of band) once into one POSIX shared-memory segment; only the segment's name
travels through the manager, in a small frame in front of the job's pickle
(mpsched._payload.frames). A worker the manager started writes a large result the same way.
Nobody here unpickles anything: this module moves bytes and names, and the manager reads
only the frame.

Names are ``mps<pid>_<start>_...``: the pid of the manager that owns the segment and that
process's start time (in hundredths of a second). A manager removes every segment of its
own prefix when it stops, and at start every segment whose manager is no longer running
(killed before it could clean up), so a crash leaks nothing past the next start.

Segments are opened with ``_posixshmem`` directly rather than through
``multiprocessing.shared_memory``: before Python 3.13 that class registers every segment it
creates *or attaches* with the resource tracker, which unlinks them (with a warning) when
the attaching process exits, whoever owns them. Data is written with ``pwrite``, never
through a mapping: a full tmpfs then fails the write with ENOSPC (and the job goes inline)
instead of killing the writer with SIGBUS.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
from collections.abc import Sequence

import psutil

from mpsched._core.job import Payload, PayloadOptions
from mpsched._payload import frames

try:
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows, or a build without POSIX shm
    _posixshmem = None

log = logging.getLogger("mpsched.shm")

THRESHOLD = 64 * 1024  # buffers this large or larger go out of band
SHM_DIR = "/dev/shm"
_NAME = re.compile(r"mps(\d+)_(\d+)_")
_logged: set[str] = set()  # fallback reasons already logged by this process


def available() -> bool:
    """True where POSIX shared memory can be used at all."""
    return _posixshmem is not None and os.path.isdir(SHM_DIR)


def log_fallback(reason: str) -> None:
    """Say once per process, at INFO, why payloads travel inline."""
    if reason not in _logged:
        _logged.add(reason)
        log.info("payloads travel inline through the manager: %s", reason)


def manager_prefix(pid: int) -> str:
    """The name prefix of the segments owned by the manager process ``pid``."""
    return f"mps{pid}_{_started(pid)}_"


def _started(pid: int) -> int:
    return round(psutil.Process(pid).create_time() * 100)


def new_name(prefix: str, kind: str) -> str:
    """A fresh segment name under ``prefix``; ``kind`` says who made it (readers of a
    ``/dev/shm`` listing: "j" a job's arguments, "r" a result)."""
    return f"{prefix}{kind}{secrets.token_hex(8)}"


def pool_stem(prefix: str, client_id: str) -> str:
    """The name prefix of the reusable segments of client ``client_id``
    (mpsched._payload.segment_pool): job arguments ("j"), then "p" (never in a hex name)."""
    return f"{prefix}jp{client_id}_"


def pool_owner(prefix: str, name: str) -> str:
    """The client whose reusable segment ``name`` is; "" for any other segment."""
    start = len(prefix) + 2
    if not name.startswith("jp", len(prefix)):
        return ""
    end = name.find("_", start)
    return name[start:end] if end > 0 else ""


def result_name(prefix: str, lease_id: int) -> str:
    """Where a local worker writes the large buffers of a lease's result: named by the
    lease, so the manager can unlink it if the worker dies before reporting it."""
    return f"{prefix}r{lease_id}"


def write(
    name: str, buffers: Sequence[memoryview], *, reuse: bool = False
) -> tuple[int, tuple[frames.BufferEntry, ...]] | None:
    """Create segment ``name`` holding ``buffers`` (laid out by :func:`layout`); with
    ``reuse``, overwrite the existing segment ``name`` instead.

    Returns its size and where each buffer went, or None when shared memory could not take
    them (full, missing, too many open files; with ``reuse``, the segment is gone): no
    segment ``name`` is left behind then.
    """
    if _posixshmem is None:
        return None
    size, entries = frames.layout(buffers)
    flags = os.O_RDWR if reuse else os.O_CREAT | os.O_EXCL | os.O_RDWR
    try:
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    except OSError as exc:
        if not reuse:
            log_fallback(f"cannot create a shared-memory segment ({exc})")
        return None
    try:
        for entry, buffer in zip(entries, buffers, strict=True):
            _write_all(fd, buffer, entry.offset)
    except OSError as exc:  # ENOSPC, ENOMEM, EFBIG: /dev/shm is full or capped
        log_fallback(f"shared memory is short ({exc})")
        os.close(fd)
        unlink(name)
        return None
    os.close(fd)
    return size, entries


def _write_all(fd: int, buffer: memoryview, offset: int) -> None:
    view = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], offset + done)


def read(name: str, entries: Sequence[frames.BufferEntry]) -> list[bytes | memoryview]:
    """The buffers of segment ``name``, for ``pickle.loads(..., buffers=...)``.

    A read-only buffer comes back as ``bytes`` (read, one copy: a ``bytes`` argument is
    rebuilt from it without another); a writable one as a view of a private copy-on-write
    mapping (no copy: a NumPy array views it, and writes to it stay in this process).
    The segment itself stays: its owner unlinks it.

    Raises:
        OSError: the segment is gone or unreadable.
    """
    if _posixshmem is None:
        raise OSError("this platform has no POSIX shared memory")
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    try:
        mapped: memoryview | None = None
        buffers: list[bytes | memoryview] = []
        for entry in entries:
            if entry.readonly:
                buffers.append(_read_all(fd, entry))
                continue
            if mapped is None:
                size = os.fstat(fd).st_size
                mapped = memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_COPY))
            buffers.append(mapped[entry.offset : entry.offset + entry.length])
        return buffers
    finally:
        os.close(fd)


def _read_all(fd: int, entry: frames.BufferEntry) -> bytes:
    data = os.pread(fd, entry.length, entry.offset)
    if len(data) == entry.length:
        return data
    # tmpfs answers in one call; anything else may return less.
    buffer = bytearray(data)
    while len(buffer) < entry.length:
        chunk = os.pread(fd, entry.length - len(buffer), entry.offset + len(buffer))
        if not chunk:
            raise OSError(f"shared-memory segment shorter than {entry.length} bytes")
        buffer += chunk
    return bytes(buffer)


def unlink(name: str) -> None:
    """Remove segment ``name`` (mappings of it stay valid); a missing one is fine."""
    if _posixshmem is not None:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name)


def names(prefix: str) -> list[str]:
    """The segments in ``/dev/shm`` whose names start with ``prefix``."""
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return []


def sweep(prefix: str) -> int:
    """Unlink every segment of ``prefix``; returns how many there were."""
    found = names(prefix) if prefix else []
    for name in found:
        unlink(name)
    return len(found)


def sweep_dead_managers() -> int:
    """Unlink the segments of managers that are no longer running; returns how many."""
    dead: dict[str, bool] = {}
    removed = 0
    for name in names("mps"):
        match = _NAME.match(name)
        if match is None:
            continue
        prefix = match.group(0)
        if prefix not in dead:
            dead[prefix] = not _running(int(match.group(1)), int(match.group(2)))
        if dead[prefix]:
            with contextlib.suppress(PermissionError):  # another user's manager
                unlink(name)
                removed += 1
    if removed:
        log.info("removed %d shared-memory segment(s) left by stopped managers", removed)
    return removed


def _running(pid: int, started: int) -> bool:
    try:
        return _started(pid) == started
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def shared_with(options: PayloadOptions) -> str:
    """The manager's prefix if this process maps the same shared memory as the manager
    (it reads the manager's probe segment back), else "" (logged once)."""
    if not options.prefix:
        return ""
    if not available():
        log_fallback("this platform has no POSIX shared memory (/dev/shm)")
        return ""
    try:
        probe = frames.BufferEntry(offset=0, length=len(options.probe), readonly=True)
        found = read(options.prefix + "probe", [probe])
    except OSError as exc:
        log_fallback(f"this process does not see the manager's shared memory ({exc})")
        return ""
    if found != [options.probe]:
        log_fallback("this process sees another shared memory than the manager's")
        return ""
    return options.prefix


def inline(payload: Payload) -> Payload:
    """``payload`` carrying its segment's buffers itself (as ``frames.carry`` makes them),
    for a worker that cannot map the segment (another host). Other payloads come back as
    they are. The segment stays: its owner unlinks it.

    Raises:
        OSError: the segment is gone or unreadable.
    """
    parsed = frames.parse(payload)
    if parsed is None or not parsed.segment:
        return payload
    if _posixshmem is None:
        raise OSError("this platform has no POSIX shared memory")
    data = bytearray(parsed.size)
    view = memoryview(data)
    fd = _posixshmem.shm_open("/" + parsed.segment, os.O_RDONLY, mode=0o600)
    try:
        for entry in parsed.entries:
            part = view[entry.offset : entry.offset + entry.length]
            if os.preadv(fd, [part], entry.offset) != entry.length:
                raise OSError(f"shared-memory segment {parsed.segment} is short")
    finally:
        os.close(fd)
    return frames.carried(parsed.size, parsed.entries, data, memoryview(payload)[parsed.body :])


def payload_size(payload: Payload) -> int:
    """Bytes a pending payload holds: its own length plus its segment's size."""
    if not frames.segment_of(payload):
        return len(payload)
    return len(payload) + frames.segment_size(payload)


def release(payload: Payload) -> None:
    """Unlink the segment a payload refers to, if any (its owner is done with it)."""
    segment = frames.segment_of(payload)
    if segment:
        unlink(segment)
