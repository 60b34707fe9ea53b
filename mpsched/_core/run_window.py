"""RunWindow: the soonest jobs, leased already, for local workers to claim themselves.

A step of docs/design/run-window.md: the window's rules, pure, tested with threads and a
fake clock. Nothing in the manager or the workers uses it yet.

The manager puts the next jobs in heap order in the window (``fill_locked``), each under
a lease. An idle worker claims the first entry that is due (``claim_locked``); when none
is, it sleeps until the next falls due (``wake_at_locked``, ``claim_next``). A claim
moves the entry to the claim log, which the manager reads at its next sweep
(``sweep_locked``): from then on the job counts as started on that worker. A worker that
reports an end rings the manager only while no sweep is promised (``ring_locked``).

Order. The window holds a prefix of the pending jobs in heap order: every entry sorts
before every job left in the heap. The caller keeps that so. A job that enters the heap
sorting before the window's last entry is placed in the window instead; the entry it
pushes out of a full window goes back to the heap. An entry due before every other bumps
``generation``: sleepers look again, since they sleep for a later due time. Entries
taken back (a cancel, a stop) go back to the heap as never received.

Where the state lives is the caller's: ``WindowRows`` is plain lists in a test, and shared
memory for worker processes. Every method whose name ends in ``_locked`` is called with the
window's lock held, by the manager or a worker; the window has no lock of its own. Each
holds it for a few reads and writes, never across a wait.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from mpsched._core.clock import Clock, ahead

# How long after a sweep that found ends the manager sweeps again without being rung:
# while ends stream in, one sweep serves several, and the workers ring no one.
SWEEP_PERIOD = 0.005


class Entry(NamedTuple):
    """A job in the window, leased: where it goes in the order, and when it is due."""

    lease_id: int
    due: float  # on the monotonic clock the manager and its workers share
    level: int  # its priority's level: lower goes first among jobs due together
    seq: int  # submission order: the last tie-break


class Claim(NamedTuple):
    """A worker claimed an entry: it runs the job from ``started`` on."""

    lease_id: int
    taker: int  # the claiming worker's number (its claim slot's, for a local worker)
    started: float


class Head(NamedTuple):
    """Where the entries and claims are in their rings, and what the workers must know."""

    ready_first: int  # ring index of the first entry not claimed
    ready_count: int
    claims_first: int  # ring index of the first claim the manager has not swept
    claims_count: int
    generation: int  # bumped when an entry is due before all others: sleepers look again
    sweep_by: float  # the manager sweeps by then unrung; 0: no sweep promised
    backlog: bool  # jobs wait in the heap for room here: a claim that leaves little rings


EMPTY_HEAD = Head(0, 0, 0, 0, 0, 0.0, False)


class WindowRows(Protocol):
    """Where a window keeps its head, its entries and its claims: two rings of
    ``capacity`` rows each. Read and written only with the window's lock held."""

    @property
    def capacity(self) -> int: ...
    def head(self) -> Head: ...
    def set_head(self, head: Head) -> None: ...
    def entry(self, index: int) -> Entry: ...
    def set_entry(self, index: int, entry: Entry) -> None: ...
    def claim(self, index: int) -> Claim: ...
    def set_claim(self, index: int, claim: Claim) -> None: ...


class ListRows:
    """A window's rows in plain lists: for one process (and for tests)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a window holds at least one entry, not {capacity}")
        self._capacity = capacity
        self._head = EMPTY_HEAD
        self._entries = [Entry(0, 0.0, 0, 0)] * capacity
        self._claims = [Claim(0, 0, 0.0)] * capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    def head(self) -> Head:
        return self._head

    def set_head(self, head: Head) -> None:
        self._head = head

    def entry(self, index: int) -> Entry:
        return self._entries[index]

    def set_entry(self, index: int, entry: Entry) -> None:
        self._entries[index] = entry

    def claim(self, index: int) -> Claim:
        return self._claims[index]

    def set_claim(self, index: int, claim: Claim) -> None:
        self._claims[index] = claim


class RunWindow:
    """The rules of a run window over its rows; see the module docstring.

    Entries and unswept claims share the capacity: a claim moves an entry to the log, and
    the room to place more comes back once the manager has swept it.
    """

    def __init__(
        self, rows: WindowRows, *, by_time: bool = True, sweep_period: float = SWEEP_PERIOD
    ) -> None:
        """``by_time``: the heap's order is (due, priority, submission), as with
        ``order="time"``; otherwise (priority, due, submission). ``sweep_period``: how
        soon the manager promises to sweep again while ends stream in."""
        self._rows = rows
        self._capacity = rows.capacity
        self._by_time = by_time
        self._period = sweep_period
        # A claim that leaves this few entries rings the manager to refill, while jobs
        # wait in the heap (``Head.backlog``) and no sweep is promised.
        self._low = max(1, self._capacity // 4)

    def _key(self, entry: Entry) -> tuple[float, int, int] | tuple[int, float, int]:
        if self._by_time:
            return (entry.due, entry.level, entry.seq)
        return (entry.level, entry.due, entry.seq)

    # ------------------------------------------------------------------ reading
    # Each method reads the head once: in shared memory a read is a struct unpack.

    def ready_locked(self) -> list[Entry]:
        """The entries not claimed yet, in the order workers get them."""
        return self._ready(self._rows.head())

    def room_locked(self) -> int:
        """How many more entries fit before the manager sweeps."""
        return self._room(self._rows.head())

    def generation_locked(self) -> int:
        """A count that moves when sleepers must look again (see the module docstring)."""
        return self._rows.head().generation

    def wake_at_locked(self) -> float | None:
        """When the next entry falls due (None: the window is empty)."""
        return self._wake_at(self._rows.head())

    def _ready(self, head: Head) -> list[Entry]:
        entry, first, capacity = self._rows.entry, head.ready_first, self._capacity
        return [entry((first + i) % capacity) for i in range(head.ready_count)]

    def _room(self, head: Head) -> int:
        return self._capacity - head.ready_count - head.claims_count

    def _wake_at(self, head: Head) -> float | None:
        if not head.ready_count:
            return None
        if self._by_time:  # sorted by due time: the first is due first
            return self._rows.entry(head.ready_first).due
        return min(entry.due for entry in self._ready(head))

    # ------------------------------------------------------------------ the manager's side

    def fill_locked(self, entries: list[Entry], *, backlog: bool | None = None) -> int:
        """Append ``entries``, the next jobs popped from the heap in its order, as far as
        there is room; returns how many went in (the rest stay in the heap). ``backlog``:
        whether jobs wait in the heap beyond these (None: as it was).

        Raises:
            ValueError: an entry sorts before the window's last: place it instead.
        """
        head = self._rows.head()
        count = min(len(entries), self._room(head))
        if head.ready_count:
            last: Entry | None = self._rows.entry(
                (head.ready_first + head.ready_count - 1) % self._capacity
            )
        else:
            last = None
        for entry in entries[:count]:
            if last is not None and self._key(entry) < self._key(last):
                raise ValueError(f"lease {entry.lease_id} sorts before the window's last entry")
            last = entry
        woken_at = self._wake_at(head)
        for i, entry in enumerate(entries[:count]):
            self._rows.set_entry((head.ready_first + head.ready_count + i) % self._capacity, entry)
        soonest = min((entry.due for entry in entries[:count]), default=None)
        # By time, an entry appended is due first only in an empty window.
        sooner = soonest is not None and (woken_at is None or soonest < woken_at)
        self._rows.set_head(
            head._replace(
                ready_count=head.ready_count + count,
                generation=head.generation + sooner,
                backlog=head.backlog if backlog is None else backlog,
            )
        )
        return count

    def place_locked(self, entry: Entry) -> Entry | None:
        """Put ``entry`` at its place in the order. Returns what must go back to the heap
        (None: nothing): with the window full, its last entry, or ``entry`` itself when it
        sorts after that one. Sleepers are to be woken (``generation``) when it is due
        before every other entry."""
        head = self._rows.head()
        woken_at = self._wake_at(head)
        ready = self._ready(head)
        key = self._key(entry)
        at = next((i for i, e in enumerate(ready) if key < self._key(e)), len(ready))
        out = None
        if self._room(head) == 0:
            if at == len(ready):
                return entry
            out = ready.pop()
        ready.insert(at, entry)
        for i in range(at, len(ready)):
            self._rows.set_entry((head.ready_first + i) % self._capacity, ready[i])
        sooner = woken_at is None or entry.due < woken_at
        self._rows.set_head(
            head._replace(ready_count=len(ready), generation=head.generation + sooner)
        )
        return out

    def take_back_locked(self, lease_ids: Collection[int]) -> list[Entry]:
        """Take the entries of ``lease_ids`` out of the window, in order, for the heap.
        An entry claimed already is not among them: its worker runs it."""
        head = self._rows.head()
        ready = self._ready(head)
        back = [entry for entry in ready if entry.lease_id in lease_ids]
        if back:  # the rest fall due no sooner: sleepers need not look again
            kept = [entry for entry in ready if entry.lease_id not in lease_ids]
            self._rewrite_locked(head, kept)
        return back

    def take_back_all_locked(self) -> list[Entry]:
        """Every entry not claimed yet, out of the window, in order (the manager stops)."""
        head = self._rows.head()
        back = self._ready(head)
        self._rewrite_locked(head, [])
        return back

    def set_backlog_locked(self, backlog: bool) -> None:
        """Whether jobs wait in the heap for room here (the manager says at each fill)."""
        self._rows.set_head(self._rows.head()._replace(backlog=backlog))

    def sweep_locked(self, now: float, ended: int) -> list[Claim]:
        """The claims since the last sweep, in claim order, and their room back.
        ``ended``: how many reports this sweep found. While claims or ends come in, the
        next sweep is promised ``sweep_period`` from ``now``; otherwise none is, and the
        next worker to report rings.

        The caller reads the workers' reports under the same hold of the lock: a worker
        writes its report before it asks :meth:`ring_locked`, so a report that this sweep
        misses finds no sweep promised, and rings."""
        head = self._rows.head()
        claims = [
            self._rows.claim((head.claims_first + i) % self._capacity)
            for i in range(head.claims_count)
        ]
        streaming = bool(claims) or ended > 0
        self._rows.set_head(
            head._replace(
                claims_first=(head.claims_first + head.claims_count) % self._capacity,
                claims_count=0,
                sweep_by=now + self._period if streaming else 0.0,
            )
        )
        return claims

    # ------------------------------------------------------------------ the workers' side

    def claim_locked(self, taker: int, now: float) -> Claim | None:
        """Claim the first entry due by ``now`` for worker ``taker``; None if none is."""
        head = self._rows.head()
        first, count = head.ready_first, head.ready_count
        found = -1
        for i in range(count):
            entry = self._rows.entry((first + i) % self._capacity)
            if entry.due <= now:
                found = i
                break
            if self._by_time:
                break  # sorted by due time: no later entry is due either
        if found < 0:
            return None
        # The entries before it move one row on, into its row: the ring starts one later.
        for i in range(found, 0, -1):
            earlier = self._rows.entry((first + i - 1) % self._capacity)
            self._rows.set_entry((first + i) % self._capacity, earlier)
        claim = Claim(entry.lease_id, taker, now)
        self._rows.set_claim((head.claims_first + head.claims_count) % self._capacity, claim)
        self._rows.set_head(
            head._replace(
                ready_first=(first + 1) % self._capacity,
                ready_count=count - 1,
                claims_count=head.claims_count + 1,
            )
        )
        return claim

    def ring_locked(self, now: float, *, claimed: bool = False) -> bool:
        """Whether a worker must ring the manager: it reported an end, or (``claimed``)
        its claim left few entries while jobs wait in the heap; and no sweep is promised.
        A claim that left none rings unless a sweep is due already: jobs shorter than a
        sweep period would leave the workers idle until it. If it rings, a sweep counts
        as promised (by now, for an empty window), so that no other worker rings too."""
        head = self._rows.head()
        if claimed:
            if not head.backlog or head.ready_count >= self._low:
                return False
            if head.ready_count == 0 and head.sweep_by > now:
                self._rows.set_head(head._replace(sweep_by=now))
                return True
        if head.sweep_by:
            return False
        self._rows.set_head(head._replace(sweep_by=now + self._period))
        return True

    def _rewrite_locked(self, head: Head, ready: list[Entry]) -> None:
        for i, entry in enumerate(ready):
            self._rows.set_entry((head.ready_first + i) % self._capacity, entry)
        self._rows.set_head(head._replace(ready_count=len(ready)))


class Sleeper(Protocol):
    """How a worker waits for the window: a condition in a test, a futex on the head's
    ``generation`` in shared memory (mpsched._worker.window_file)."""

    def sleep(self, generation: int, timeout: float) -> None:
        """Wait, without the window's lock, until ``generation`` has moved on from the
        value given or ``timeout`` seconds have passed; it may return sooner."""


def claim_next(
    window: RunWindow,
    lock: AbstractContextManager[Any],
    sleeper: Sleeper,
    clock: Clock,
    taker: int,
    timeout: float,
    ring: Callable[[], None] | None = None,
) -> Claim | None:
    """Claim the next entry for worker ``taker`` as soon as it is due, waiting at most
    ``timeout`` seconds; None if none was claimed in time.

    ``lock`` is the window's lock. Between two looks the worker sleeps until the first
    entry is due, or until ``generation`` moves (an entry due sooner came in): whoever
    moves it wakes the sleepers. ``ring`` rings the manager, once the lock is let go,
    when the claim left the window for a refill (:meth:`RunWindow.ring_locked`).
    """
    deadline = clock.now() + timeout
    while True:
        with lock:
            now = clock.now()
            claim = window.claim_locked(taker, now)
            if claim is not None:
                refill = ring is not None and window.ring_locked(now, claimed=True)
                break
            if now >= deadline:
                return None
            due, generation = window.wake_at_locked(), window.generation_locked()
        until = deadline if due is None else min(due, deadline)
        sleeper.sleep(generation, ahead(until - now))
    if refill and ring is not None:
        ring()
    return claim
