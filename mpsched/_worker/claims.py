"""A local worker's claim slot: which of its prefetched jobs it has started, and the
reports it has not sent yet, shared with the manager that started it
(mpsched._core.prefetch says why and when jobs are prefetched).

In shared memory, created by the manager and inherited by the worker process:

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

A claim and a revocation each check one value and set the other, under one lock (a POSIX
semaphore) that both hold for a few bytecodes only; so a prefetched job is either started
by its worker or given back to the heap, never both and never neither.
"""

from __future__ import annotations

import time
from multiprocessing.context import BaseContext
from typing import Any

NEVER = (1 << 63) - 1  # revoked_from when nothing is revoked
KEPT_BYTES = 1 << 16  # room for kept reports; one that does not fit is sent at once
REVOKE_TIMEOUT = 0.5  # seconds the manager waits for a worker's slot before it gives up
FENCE_WAIT = 30.0  # seconds a worker waits for its manager's fence to say yes or no
FENCE_LOOK = 0.005  # seconds between two looks meanwhile (only while it is in doubt)


class ClaimSlot:
    """One local worker's slot; picklable to the worker process while it is started."""

    def __init__(self, ctx: BaseContext) -> None:
        # [started, revoked_from, bytes of kept reports, fence: valid until (ns), stale
        # below]; the fence is written by the manager only, each value whole.
        self._values: Any = ctx.RawArray("q", [0, NEVER, 0, NEVER, 0])
        # Kept reports, each a 4-byte length and its bytes; written by the worker only,
        # read by the manager only once the worker has exited (no lock needed).
        self._kept: Any = ctx.RawArray("B", KEPT_BYTES)
        # Guards the check-and-set of claim() and revoke(): held by the worker in claim()
        # and by the manager in revoke(), each for a few bytecodes; nobody waits on it for
        # long. received() and reopen() write one value without it (see each).
        self._lock = ctx.Lock()

    # ------------------------------------------------------------- the worker's side

    def received(self, lease_id: int) -> None:
        """The worker got the first job of a batch (no one revokes it): an attempt from now
        on. Without the lock: a revocation under way is of a batch before this one, all of
        whose jobs this worker already started or was refused."""
        self._values[0] = lease_id

    def claim(self, lease_id: int) -> bool:
        """The worker is about to start prefetched lease ``lease_id``: True if it may (it
        counts as started from now on), False if it was revoked (it and every later job
        of the batch go to other workers)."""
        with self._lock:
            if lease_id >= self._values[1]:
                return False
            self._values[0] = lease_id
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

    def keep(self, record: bytes) -> bool:
        """Keep one report's bytes until :meth:`forget_kept`; False if there is no room
        (the caller sends its reports now instead). A record is written before the count
        that includes it, so one cut short by the worker's death is never read."""
        used = int(self._values[2])
        end = used + 4 + len(record)
        if end > KEPT_BYTES:
            return False
        view = memoryview(self._kept).cast("B")
        view[used:used + 4] = len(record).to_bytes(4, "little")
        view[used + 4:end] = record
        self._values[2] = end
        return True

    def forget_kept(self) -> None:
        """The manager has every kept report (they went with a take, or were sent)."""
        self._values[2] = 0

    # ------------------------------------------------------------ the manager's side

    def kept(self) -> list[bytes]:
        """The reports the worker kept and had not forgotten; read once it has exited."""
        used = int(self._values[2])
        view = memoryview(self._kept).cast("B")
        records, at = [], 0
        while at + 4 <= used:
            size = int.from_bytes(view[at:at + 4], "little")
            records.append(bytes(view[at + 4:at + 4 + size]))
            at += 4 + size
        return records

    def started(self) -> int:
        """The last lease id the worker received or claimed."""
        return int(self._values[0])

    def fence(self, valid_ns: int, stale_below: int) -> None:
        """Set the manager's fence (see may_start): stale_below first, so that a worker
        that reads the new valid_until reads the new stale_below too."""
        self._values[4] = stale_below
        self._values[3] = valid_ns

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
