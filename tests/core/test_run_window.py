"""RunWindow: filling, claiming, a new first entry, taking back, sweeps and rings; with
threads on a fake clock, and against a plain model over many random steps."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from fakeclock import FakeClock

from mpsched._core.run_window import (
    Claim,
    Entry,
    ListRows,
    RunWindow,
    claim_next,
)

HIGH, MEDIUM, LOW = 1, 2, 3
JOIN = 10.0  # real seconds a test waits for a thread it started to finish
T0 = 1000.0  # the fake clock's start


def entry(lease_id: int, due: float, level: int = MEDIUM, seq: int | None = None) -> Entry:
    return Entry(lease_id, T0 + due, level, lease_id if seq is None else seq)


def leases(entries: list[Entry] | list[Claim]) -> list[int]:
    return [e.lease_id for e in entries]


def window(capacity: int = 8, *, by_time: bool = True) -> RunWindow:
    return RunWindow(ListRows(capacity), by_time=by_time, sweep_period=0.005)


# ---------------------------------------------------------------------- one thread


def test_a_worker_claims_entries_in_order_each_once_it_is_due() -> None:
    w = window()
    assert w.fill_locked([entry(1, 0.0, HIGH, seq=5), entry(2, 0.0), entry(3, 1.0)]) == 3
    assert w.claim_locked(7, T0 - 0.001) is None  # none due yet
    assert w.claim_locked(7, T0) == Claim(1, 7, T0)
    second = w.claim_locked(8, T0)
    assert second is not None and second.lease_id == 2
    assert w.claim_locked(7, T0 + 0.5) is None
    assert w.wake_at_locked() == T0 + 1.0
    assert leases(w.ready_locked()) == [3]


def test_fill_refuses_an_entry_that_sorts_before_the_last() -> None:
    w = window()
    w.fill_locked([entry(1, 1.0)])
    with pytest.raises(ValueError, match="lease 2 sorts before"):
        w.fill_locked([entry(2, 0.5)])
    assert leases(w.ready_locked()) == [1]


def test_fill_takes_only_what_fits_and_claims_hold_room_until_swept() -> None:
    w = window(capacity=3)
    assert w.fill_locked([entry(n, 0.0) for n in range(1, 6)]) == 3
    assert w.room_locked() == 0
    assert w.claim_locked(1, T0) is not None
    assert w.room_locked() == 0  # the claim holds its row until the manager sweeps
    assert leases(w.sweep_locked(T0, ended=0)) == [1]
    assert w.room_locked() == 1
    assert w.fill_locked([entry(4, 0.0), entry(5, 0.0)]) == 1


def test_priority_order_claims_the_first_due_entry_past_one_not_due() -> None:
    w = window(by_time=False)
    w.fill_locked([entry(1, 5.0, HIGH), entry(2, 0.0, MEDIUM), entry(3, 0.0, LOW)])
    assert w.wake_at_locked() == T0  # the soonest due, not the first
    claim = w.claim_locked(1, T0)
    assert claim is not None and claim.lease_id == 2
    assert leases(w.ready_locked()) == [1, 3]  # the rest keep their order
    claim = w.claim_locked(1, T0 + 5.0)
    assert claim is not None and claim.lease_id == 1


def test_a_placed_entry_goes_to_its_place_and_a_sooner_one_wakes_sleepers() -> None:
    w = window()
    w.fill_locked([entry(1, 1.0), entry(2, 3.0)])
    generation = w.generation_locked()
    assert w.place_locked(entry(3, 2.0)) is None
    assert leases(w.ready_locked()) == [1, 3, 2]
    assert w.generation_locked() == generation  # due after the first: no one wakes
    assert w.place_locked(entry(4, 0.5)) is None
    assert leases(w.ready_locked()) == [4, 1, 3, 2]
    assert w.generation_locked() == generation + 1
    assert w.wake_at_locked() == T0 + 0.5


def test_placing_into_a_full_window_pushes_its_last_entry_back_to_the_heap() -> None:
    w = window(capacity=2)
    w.fill_locked([entry(1, 1.0), entry(2, 2.0)])
    assert w.place_locked(entry(3, 3.0)) == entry(3, 3.0)  # after the last: stays out
    assert w.place_locked(entry(4, 0.5)) == entry(2, 2.0)
    assert leases(w.ready_locked()) == [4, 1]


def test_taking_back_returns_only_entries_not_claimed_and_keeps_the_order() -> None:
    w = window()
    w.fill_locked([entry(n, 0.0) for n in range(1, 6)])
    w.claim_locked(1, T0)
    assert leases(w.take_back_locked({1, 2, 4})) == [2, 4]
    assert leases(w.ready_locked()) == [3, 5]
    assert leases(w.sweep_locked(T0, ended=0)) == [1]  # the claimed one still runs
    assert leases(w.take_back_all_locked()) == [3, 5]
    assert w.ready_locked() == [] and w.wake_at_locked() is None


def test_a_report_rings_only_while_no_sweep_is_promised() -> None:
    w = window()
    assert w.ring_locked(T0)  # the manager is idle: ring it
    assert not w.ring_locked(T0)  # it is rung: another worker need not
    w.sweep_locked(T0, ended=2)  # ends came in: it sweeps again unrung
    assert not w.ring_locked(T0 + 0.001)
    w.sweep_locked(T0 + 0.005, ended=0)  # nothing came: it waits to be rung
    assert w.ring_locked(T0 + 0.006)


def test_a_claim_rings_for_a_refill_only_when_jobs_wait_and_few_entries_are_left() -> None:
    w = window(capacity=8)  # rings below 2 entries left
    w.fill_locked([entry(n, 0.0) for n in range(1, 4)], backlog=True)
    w.claim_locked(1, T0)
    assert not w.ring_locked(T0, claimed=True)  # two left
    w.claim_locked(1, T0)
    assert w.ring_locked(T0, claimed=True)  # one left, and jobs wait in the heap
    w.sweep_locked(T0, ended=0)  # the manager sweeps the claims,
    w.sweep_locked(T0 + 0.005, ended=0)  # then finds nothing: no sweep promised
    w.set_backlog_locked(False)  # and nothing more waits in the heap
    w.claim_locked(1, T0)
    assert not w.ring_locked(T0, claimed=True)  # none left, but nothing to refill
    w.set_backlog_locked(True)
    assert w.ring_locked(T0, claimed=True)


def test_a_claim_that_leaves_the_window_low_rings_through_claim_next() -> None:
    w, lock, rings = window(capacity=4), threading.Lock(), []
    w.fill_locked([entry(1, 0.0), entry(2, 0.0)], backlog=True)
    clock = FakeClock(start=T0)
    never = NeverWoken()
    claim = claim_next(w, lock, never, clock, 1, 0.0, lambda: rings.append(1))
    assert claim is not None and claim.lease_id == 1 and rings == []  # one left: enough
    claim = claim_next(w, lock, never, clock, 1, 0.0, lambda: rings.append(2))
    assert claim is not None and claim.lease_id == 2 and rings == [2]  # none left
    assert claim_next(w, lock, never, clock, 1, 0.0, lambda: rings.append(3)) is None
    assert rings == [2]


class NeverWoken:
    """A Sleeper for a worker that never waits (its timeout is 0)."""

    def sleep(self, generation: int, timeout: float) -> None:
        raise AssertionError("a worker with no time to wait slept")


def test_a_claim_that_empties_the_window_rings_even_with_a_sweep_promised() -> None:
    w = window(capacity=8)
    w.fill_locked([entry(n, 0.0) for n in range(1, 3)], backlog=True)
    w.sweep_locked(T0, ended=1)  # ends stream in: the next sweep is promised by T0 + 5 ms
    w.claim_locked(1, T0)
    assert not w.ring_locked(T0, claimed=True)  # one left: the promised sweep refills
    w.claim_locked(2, T0)
    assert w.ring_locked(T0, claimed=True)  # none left: the workers would idle till then
    assert not w.ring_locked(T0, claimed=True)  # rung: a sweep is due now
    assert not w.ring_locked(T0)  # a report need not ring either


# ---------------------------------------------------------------------- threads


@dataclass
class Workers:
    """Worker threads claiming from one window through ``claim_next`` on a fake clock;
    each records its claims. The fixture stops and joins them all."""

    clock: FakeClock
    window: RunWindow
    # The window's lock; it also guards claims and stop.
    lock: threading.Lock = field(default_factory=threading.Lock)
    claims: list[Claim] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stop: bool = False

    def __post_init__(self) -> None:
        # Notified (all) when an entry due before every other is placed, and at the stop.
        self.woken = self.clock.condition(self.lock)

    def start(self, count: int) -> None:
        for taker in range(len(self.threads), len(self.threads) + count):
            thread = threading.Thread(target=self._run, args=(taker,), name=f"taker-{taker}")
            self.threads.append(thread)
            thread.start()

    def sleep(self, generation: int, timeout: float) -> None:
        """The Sleeper of these threads: a condition over the window's lock."""
        with self.lock:
            if self.window.generation_locked() == generation:
                self.woken.wait(timeout)

    def _run(self, taker: int) -> None:
        while True:
            claim = claim_next(self.window, self.lock, self, self.clock, taker, 60.0)
            with self.lock:
                if claim is not None:
                    self.claims.append(claim)
                if self.stop:
                    return

    def place(self, entry: Entry) -> None:
        with self.lock:
            generation = self.window.generation_locked()
            assert self.window.place_locked(entry) is None
            if self.window.generation_locked() != generation:
                self.woken.notify_all()

    def fill(self, entries: list[Entry]) -> None:
        with self.lock:
            generation = self.window.generation_locked()
            assert self.window.fill_locked(entries) == len(entries)
            if self.window.generation_locked() != generation:
                self.woken.notify_all()

    def claimed(self) -> list[int]:
        with self.lock:
            return leases(self.claims)

    def close(self) -> None:
        with self.lock:
            self.stop = True
            self.woken.notify_all()
        # Past every claim_next's timeout; again for a thread that went back to sleep
        # between the notify and a move of the clock.
        for _ in range(int(JOIN / 0.05)):
            self.clock.advance(120.0)
            for thread in self.threads:
                thread.join(0.05)
            if not any(thread.is_alive() for thread in self.threads):
                return
        raise AssertionError("a worker thread did not stop")


@pytest.fixture
def workers() -> Iterator[Workers]:
    clock = FakeClock(start=T0)
    pool = Workers(clock, window(capacity=16))
    yield pool
    pool.close()


def test_sleeping_workers_claim_each_entry_once_in_order_as_it_falls_due(
    workers: Workers,
) -> None:
    workers.start(3)
    workers.clock.wait_parked(3)  # the window is empty: each waits to be woken
    workers.fill([entry(n, n * 1.0) for n in range(1, 6)])
    for n in range(1, 6):
        workers.clock.wait_parked(3)  # each asleep until the next falls due
        assert workers.claimed() == list(range(1, n))
        workers.clock.advance(1.0)
    workers.clock.wait_parked(3)
    assert workers.claimed() == [1, 2, 3, 4, 5]
    with workers.lock:
        starts = [claim.started - T0 for claim in workers.claims]
    assert starts == [1.0, 2.0, 3.0, 4.0, 5.0]  # none early, none late


def test_a_placed_entry_due_first_wakes_the_sleepers_and_is_claimed_at_its_time(
    workers: Workers,
) -> None:
    workers.start(2)
    workers.fill([entry(1, 10.0)])
    workers.clock.wait_parked(2)  # asleep until 10 s from now
    workers.place(entry(2, 1.0))  # due before it: they must not sleep past 1 s
    workers.clock.wait_parked(2)
    assert workers.claimed() == []
    workers.clock.advance(1.0)
    workers.clock.wait_parked(2)
    assert workers.claimed() == [2]


def test_entries_taken_back_while_workers_sleep_are_never_claimed(workers: Workers) -> None:
    workers.start(2)
    workers.fill([entry(1, 1.0), entry(2, 2.0), entry(3, 3.0)])
    workers.clock.wait_parked(2)
    with workers.lock:
        assert leases(workers.window.take_back_locked({1, 3})) == [1, 3]
    workers.clock.advance(3.0)
    workers.clock.wait_parked(2)
    assert workers.claimed() == [2]


# ---------------------------------------------------------------------- a model


class Model:
    """What a window must do, without rings: a sorted list and a log of claims."""

    def __init__(self, capacity: int, by_time: bool) -> None:
        self.capacity = capacity
        self.by_time = by_time
        self.ready: list[Entry] = []
        self.claims: list[Claim] = []

    def key(self, e: Entry) -> tuple[float, int, int] | tuple[int, float, int]:
        return (e.due, e.level, e.seq) if self.by_time else (e.level, e.due, e.seq)

    def room(self) -> int:
        return self.capacity - len(self.ready) - len(self.claims)

    def place(self, e: Entry) -> Entry | None:
        self.ready.append(e)
        self.ready.sort(key=self.key)
        return self.ready.pop() if len(self.ready) + len(self.claims) > self.capacity else None

    def claim(self, taker: int, now: float) -> Claim | None:
        due = [e for e in self.ready if e.due <= now]
        if not due or (self.by_time and due[0] is not self.ready[0]):
            return None
        self.ready.remove(due[0])
        self.claims.append(Claim(due[0].lease_id, taker, now))
        return self.claims[-1]


@pytest.mark.parametrize("by_time", [True, False], ids=["time", "priority"])
def test_many_random_steps_agree_with_a_plain_model(by_time: bool) -> None:
    rng = random.Random(36)
    w, model = window(capacity=6, by_time=by_time), Model(6, by_time)
    now, lease, generation = T0, 0, 0
    for _ in range(5_000):
        step = rng.random()
        soonest = min((e.due for e in model.ready), default=None)
        if step < 0.35:
            lease += 1
            new = Entry(lease, now + rng.choice([0.0, 0.5, 1.0, 2.0]), rng.randint(1, 3), lease)
            assert w.place_locked(new) == model.place(new)
            generation += new in model.ready and (soonest is None or new.due < soonest)
        elif step < 0.45:
            lease += 1
            new = Entry(lease, now + rng.choice([0.0, 1.0, 3.0]), rng.randint(1, 3), lease)
            if not model.ready or model.key(new) >= model.key(model.ready[-1]):
                assert w.fill_locked([new]) == (1 if model.room() else 0)
                if model.room():
                    model.ready.append(new)
                    generation += soonest is None or new.due < soonest
            elif model.room():
                with pytest.raises(ValueError):
                    w.fill_locked([new])
        elif step < 0.75:
            taker = rng.randint(1, 3)
            assert w.claim_locked(taker, now) == model.claim(taker, now)
        elif step < 0.85:
            assert w.sweep_locked(now, ended=0) == model.claims
            model.claims = []
        elif step < 0.9 and model.ready:
            gone = {e.lease_id for e in rng.sample(model.ready, rng.randint(1, len(model.ready)))}
            assert w.take_back_locked(gone) == [e for e in model.ready if e.lease_id in gone]
            model.ready = [e for e in model.ready if e.lease_id not in gone]
        else:
            now += rng.choice([0.0, 0.25, 0.5])
        assert w.ready_locked() == model.ready
        assert w.room_locked() == model.room()
        assert w.wake_at_locked() == min((e.due for e in model.ready), default=None)
        assert w.generation_locked() == generation  # sleepers look again when they must
