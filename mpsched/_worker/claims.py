"""A local worker's claim slot: which of its jobs it has started, and the reports it has
not sent yet, shared with the manager that started it (mpsched._core.prefetch says why and
when jobs are prefetched).

In shared memory, created by the manager and mapped by the worker process:

- ``started``: the last lease id the worker received (the first job of a batch, which is
  never revoked) or claimed (a prefetched one). Lease ids grow, so when the worker dies
  every lease of it up to this one had reached it: an attempt, not a job never received.
- ``revoked_from``: the first lease id of its batch it may no longer start.
- the fence of a manager on a shared Redis queue (mpsched._manager.shared_fence): until
  when its leases hold on the monotonic clock (ns), and the lease ids below which they
  were taken back. The worker starts no job past the first, nor any below the second:
  it waits for its manager's next heartbeat instead (a manager paused past its lease).
  Without Redis they never change: every lease holds.
- the *kept* reports: a worker that goes on with its batch after a job keeps that job's
  report here first (mpsched._worker.reports holds it for a while before sending it).
  Should a later job kill the worker, the manager reads them when it sees the worker exit,
  so a job that ended is never taken for one its worker died under (and run again). The
  worker forgets them once its manager has them all.

With a SQLite store the slot is a region of a file beside the store
(mpsched._worker.slot_file), so that it outlives the manager's whole process tree: the
worker also records there which job it started last, and keeps every report (its batch's
last one too) until its manager has it. A manager started again on the store reads the
slots before it recovers the jobs that were running: a job whose report is there ended,
and a job of that worker that it never started is pending again, untouched.

A claim and a revocation each check one value and set the other, under one lock (a POSIX
semaphore) that both hold for a few bytecodes only; so a prefetched job is either started
by its worker or given back to the heap, never both and never neither.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import pickle
import time
from multiprocessing.context import BaseContext
from typing import Any

from mpsched._core.job import Lease, job_digest
from mpsched._protocol.codec import report_from_wire
from mpsched._protocol.records import LeftBehind

log = logging.getLogger("mpsched.worker")

NEVER = (1 << 63) - 1  # revoked_from when nothing is revoked
KEPT_BYTES = 1 << 16  # room for kept reports; one that does not fit is sent at once
REVOKE_TIMEOUT = 0.5  # seconds the manager waits for a worker's slot before it gives up
FENCE_WAIT = 30.0  # seconds a worker waits for its manager's fence to say yes or no
FENCE_LOOK = 0.005  # seconds between two looks meanwhile (only while it is in doubt)

# A slot's bytes: five int64 (started, revoked_from, bytes of kept reports, the fence: valid
# until (ns), stale below), the digest of the job entered last, the worker's id (a length,
# then its bytes), then the kept reports. The fence is written by the manager only, each
# value whole.
_VALUES = 5
_STARTED_JOB = 8 * _VALUES
DIGEST_BYTES = 8
_WORKER_ID = _STARTED_JOB + DIGEST_BYTES
MAX_WORKER_ID = 64
HEAD_BYTES = 128
SLOT_BYTES = HEAD_BYTES + KEPT_BYTES
# A slot's span in a slot file: mappings start at multiples of the allocation granularity.
SLOT_SPAN = -(-SLOT_BYTES // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY


class ClaimSlot:
    """One local worker's slot; picklable to the worker process while it is started."""

    def __init__(self, ctx: BaseContext, region: tuple[str, int] | None = None) -> None:
        """``region``: a slot file's path and the slot's index in it (mpsched._worker.
        slot_file), the slot then durable; by default anonymous shared memory, gone with
        the processes that map it."""
        self.region = region  # (slot file, index), or None
        self.durable = region is not None
        # Guards the check-and-set of claim() and revoke(): held by the worker in claim()
        # and by the manager in revoke(), each for a few bytecodes; nobody waits on it for
        # long. received() and reopen() write one value without it (see each).
        self._lock = ctx.Lock()
        self._attach(None if region is not None else ctx.RawArray("B", SLOT_BYTES))
        self._view[:HEAD_BYTES] = bytes(HEAD_BYTES)
        self._values[1] = self._values[3] = NEVER

    def __getstate__(self) -> dict[str, Any]:
        # A region is mapped again where the slot is unpickled; an anonymous one travels as
        # multiprocessing passes shared memory to a process it starts.
        memory = None if self.region is not None else self._memory
        return {"region": self.region, "memory": memory, "lock": self._lock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.region, self._lock = state["region"], state["lock"]
        self.durable = self.region is not None
        self._attach(state["memory"])

    def _attach(self, memory: Any) -> None:
        self._memory = memory if self.region is None else map_region(*self.region)
        self._view = memoryview(self._memory).cast("B")
        self._values: Any = (ctypes.c_int64 * _VALUES).from_buffer(self._memory)
        self._kept = self._view[HEAD_BYTES : HEAD_BYTES + KEPT_BYTES]

    # ------------------------------------------------------------- the worker's side

    def received(self, lease: Lease) -> None:
        """The worker got the first job of a batch (no one revokes it): an attempt from now
        on. Without the lock: a revocation under way is of a batch before this one, all of
        whose jobs this worker already started or was refused."""
        self._values[0] = lease.lease_id

    def claim(self, lease: Lease) -> bool:
        """The worker is about to start prefetched ``lease``: True if it may (it counts as
        started from now on), False if it was revoked (it and every later job of the batch
        go to other workers)."""
        with self._lock:
            if lease.lease_id >= self._values[1]:
                return False
            self._values[0] = lease.lease_id
            return True

    def may_start(self, lease_id: int, wait: float = FENCE_WAIT) -> bool:
        """Whether the worker may start lease ``lease_id`` by its manager's fence: True
        while the manager's leases hold; False once this one was taken back. In doubt (the
        manager's last heartbeat is too old: it may be paused), it waits for the next
        one, ``wait`` seconds at most (then False)."""
        values = self._values
        deadline = None
        while True:
            if time.monotonic_ns() < values[3]:  # read before stale_below: see fence()
                return bool(lease_id >= values[4])
            if lease_id < values[4]:
                return False
            now = time.monotonic()
            if deadline is None:
                deadline = now + wait
            elif now >= deadline:
                return False
            time.sleep(FENCE_LOOK)

    def entering(self, job_id: str) -> None:
        """The worker calls the job's callable next (a durable slot says so: read after the
        manager's death, a job its worker never entered is not an attempt)."""
        self._view[_STARTED_JOB : _STARTED_JOB + DIGEST_BYTES] = job_digest(job_id)

    def keep(self, record: bytes) -> bool:
        """Keep one report's bytes until :meth:`forget_kept`; False if there is no room
        (the caller sends its reports now instead). A record is written before the count
        that includes it, so one cut short by the worker's death is never read."""
        used = int(self._values[2])
        end = used + 4 + len(record)
        if end > KEPT_BYTES:
            return False
        self._kept[used : used + 4] = len(record).to_bytes(4, "little")
        self._kept[used + 4 : end] = record
        self._values[2] = end
        return True

    def forget_kept(self) -> None:
        """The manager has every kept report (they went with a take, or were sent)."""
        self._values[2] = 0

    # ------------------------------------------------------------ the manager's side

    def kept(self) -> list[bytes]:
        """The reports the worker kept and had not forgotten; read once it has exited."""
        return read_kept(self._view)

    def left_behind(self) -> LeftBehind:
        """What the slot says its worker left of its jobs: read once it has exited, or by
        the worker itself as it joins its manager again."""
        return read_left(self._view)

    def started(self) -> int:
        """The last lease id the worker received or claimed."""
        return int(self._values[0])

    def fence(self, valid_ns: int, stale_below: int) -> None:
        """Set the manager's fence (see may_start): stale_below first, so that a worker
        that reads the new valid_until reads the new stale_below too."""
        self._values[4] = stale_below
        self._values[3] = valid_ns

    def owner(self) -> str:
        """The worker id the slot was last named for ("": none)."""
        return read_owner(self._view)

    def name(self, worker_id: str) -> None:
        """Record whose slot this is (a durable slot is read by worker id at recovery)."""
        data = worker_id.encode()[:MAX_WORKER_ID]
        self._view[_WORKER_ID + 2 : _WORKER_ID + 2 + len(data)] = data
        self._view[_WORKER_ID : _WORKER_ID + 2] = len(data).to_bytes(2, "little")

    def reopen(self) -> None:
        """A new batch goes to the worker: it may start every job of it. Without the lock:
        the worker waits for that batch meanwhile, and the queue starts no revocation of it
        before the batch is handed (mpsched._core.prefetch.Claims.reopen)."""
        self._values[1] = NEVER

    def revoke(self, lowest: int, timeout: float = REVOKE_TIMEOUT) -> int | None:
        """Refuse the worker every lease from ``lowest`` on that it has not started; returns
        the first refused lease id, or None if the slot stayed locked past ``timeout`` (a
        worker that died or stopped inside claim(): then nothing is refused)."""
        if not self._lock.acquire(timeout=timeout):
            return None
        try:
            cut = max(int(self._values[0]) + 1, lowest)
            self._values[1] = cut
            return cut
        finally:
            self._lock.release()


def map_region(path: str, index: int) -> mmap.mmap:
    """The slot ``index`` of the slot file at ``path``, mapped shared."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, SLOT_SPAN, offset=index * SLOT_SPAN)
    finally:
        os.close(fd)


def read_kept(view: memoryview) -> list[bytes]:
    """The kept reports of the slot whose bytes are ``view``."""
    used = min(int.from_bytes(view[16:24], "little"), KEPT_BYTES)
    kept = view[HEAD_BYTES : HEAD_BYTES + KEPT_BYTES]
    records, at = [], 0
    while at + 4 <= used:
        size = int.from_bytes(kept[at : at + 4], "little")
        if at + 4 + size > used:
            break
        records.append(bytes(kept[at + 4 : at + 4 + size]))
        at += 4 + size
    return records


def read_owner(view: memoryview) -> str:
    """The worker id the slot ``view`` was last named for ("": none)."""
    length = min(int.from_bytes(view[_WORKER_ID : _WORKER_ID + 2], "little"), MAX_WORKER_ID)
    return bytes(view[_WORKER_ID + 2 : _WORKER_ID + 2 + length]).decode(errors="replace")


def read_left(view: memoryview) -> LeftBehind:
    """What the slot ``view`` says its worker left of its jobs. A kept report that does
    not read back (a slot written by something else) is left out, with a warning."""
    entered = bytes(view[_STARTED_JOB : _STARTED_JOB + DIGEST_BYTES])
    ended = []
    for record in read_kept(view):
        try:
            ended.append(report_from_wire(pickle.loads(record)))
        except Exception as exc:
            log.warning(
                "a kept report is unreadable (%s: %s); its job stays as it was",
                type(exc).__name__,
                exc,
            )
    return LeftBehind(entered=entered if any(entered) else b"", ended=tuple(ended))


class LocalClaims:
    """The claim slots of a manager's local workers, by worker id: the queue's Claims.

    The supervisor adds and removes slots (its thread only); server threads look them up.
    A dict lookup or store is atomic, so no lock is needed: a worker that has no slot
    (remote, or gone) is never handed prefetched jobs, and revoking it revokes nothing.
    """

    def __init__(self) -> None:
        self._slots: dict[str, ClaimSlot] = {}
        self._fence = (NEVER, 0)  # the manager's fence (ClaimSlot.fence), for new slots

    def add(self, worker_id: str, slot: ClaimSlot) -> None:
        slot.fence(*self._fence)
        self._slots[worker_id] = slot

    def set_fence(self, valid_ns: int, stale_below: int) -> None:
        """Move every slot's fence (a manager on a shared Redis queue: its heartbeats)."""
        self._fence = (valid_ns, stale_below)
        for slot in list(self._slots.values()):
            slot.fence(valid_ns, stale_below)

    def remove(self, worker_id: str) -> None:
        self._slots.pop(worker_id, None)

    def reopen(self, worker_id: str) -> bool:
        slot = self._slots.get(worker_id)
        if slot is None:
            return False
        slot.reopen()
        return True

    def revoke(self, worker_id: str, lowest: int) -> int | None:
        slot = self._slots.get(worker_id)
        return None if slot is None else slot.revoke(lowest)
