"""A cancelled JobFuture must wake concurrent.futures.wait() and as_completed().

Those functions learn of a cancellation only when the future moves on to
CANCELLED_AND_NOTIFIED (set_running_or_notify_cancel()); Future.cancel() alone leaves
them waiting. Every way a job of ours gets cancelled is checked here.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ALL_COMPLETED, Future, as_completed, wait
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

import jobs
import pytest
from processes import wait_for

pytestmark = pytest.mark.slow

WAIT = 30.0  # far longer than any of these needs; a lost notification hits it


def wait_all(futures: list[Any]) -> set[Any]:
    """The futures wait() still calls not done after WAIT seconds."""
    return wait(futures, timeout=WAIT, return_when=ALL_COMPLETED).not_done


def waiter_thread(futures: list[Any]) -> tuple[threading.Thread, list[Any]]:
    """A thread already blocked in as_completed(futures) before the test cancels them."""
    seen: list[Any] = []

    def run() -> None:
        with contextlib.suppress(FuturesTimeout):  # the test then sees the thread alive
            seen.extend(as_completed(futures, timeout=WAIT))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # as_completed has installed its waiter: it now depends on being notified.
    wait_for(lambda: all(f._waiters for f in futures if not f.done()), 10, "waiter installed")
    return thread, seen


def test_future_cancelled_in_the_heap_reaches_wait_and_as_completed(make_scheduler):
    s = make_scheduler(workers=1)
    done = s.submit(abs, -1)
    later = s.schedule(abs, -2, delay=3600)
    s.stats()  # flushes the write-behind outbox: the job is in the manager's heap
    thread, seen = waiter_thread([done, later])
    assert later.cancel()
    thread.join(WAIT)
    assert not thread.is_alive() and set(seen) == {done, later}
    assert not wait_all([done, later])
    assert set(as_completed([done, later], timeout=WAIT)) == {done, later}


def test_as_completed_over_many_jobs_with_one_cancelled_finishes(make_scheduler):
    s = make_scheduler(workers=2)
    futures = [s.submit(abs, -i) for i in range(19)]
    futures.append(s.schedule(abs, -19, delay=3600))
    assert futures[-1].cancel()
    assert len(list(as_completed(futures, timeout=WAIT))) == 20


class HeldService:
    """Wraps the manager proxy so the test decides when the outbox's send may go on."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.sending = threading.Event()  # set when a send reached us
        self.release = threading.Event()  # the send waits for this

    def submit(self, requests: Any, timeout: float | None, withdrawn: int = 0) -> None:
        self.sending.set()
        assert self.release.wait(WAIT)
        self._service.submit(requests, timeout, withdrawn)


def test_future_withdrawn_from_the_outbox_reaches_waiters(make_scheduler):
    s = make_scheduler(workers=1)
    outbox = s._core.outbox
    held = HeldService(outbox._service)
    outbox._service = held
    try:
        first = s.schedule(abs, -1, delay=3600)
        assert held.sending.wait(WAIT)  # the sender is busy with `first`...
        unsent = s.schedule(abs, -2, delay=3600)  # ...so this one waits in the outbox
        thread, seen = waiter_thread([unsent])
        assert unsent.cancel()
        thread.join(WAIT)
        assert not thread.is_alive() and seen == [unsent]
        assert not wait_all([unsent])  # while the send is still held: never sent at all
    finally:
        held.release.set()
    assert first.cancel()
    assert not wait_all([first, unsent])
    # The one taken back unsent still counts, as the caller saw it: submitted, cancelled.
    q = s.stats().queue
    assert (q.submitted, q.cancelled, sum(q.pending.values())) == (2, 2, 0)


def test_shutdown_cancel_futures_reaches_waiters(make_scheduler):
    s = make_scheduler(workers=1)
    far = [s.schedule(abs, -i, delay=3600) for i in range(5)]
    s.stats()  # in the heap, so cancel_pending cancels them there
    unsent_box = s._core.outbox
    held = HeldService(unsent_box._service)
    unsent_box._service = held
    try:
        plug = s.schedule(abs, 0, delay=3600)
        assert held.sending.wait(WAIT)
        unsent = [s.schedule(abs, i, delay=3600) for i in range(3)]  # still in the outbox
        thread, seen = waiter_thread(far + unsent)
        closer = threading.Thread(target=s.shutdown, kwargs={"cancel_futures": True})
        closer.start()
        # cancel_pending takes the outbox's requests back first, then flushes the one on
        # its way: let it go, so the manager can cancel it with the rest.
        wait_for(lambda: all(f.cancelled() for f in unsent), WAIT, "outbox withdrawn")
    finally:
        held.release.set()
    closer.join(WAIT)
    thread.join(WAIT)
    assert not thread.is_alive() and set(seen) == set(far + unsent)
    assert all(f.cancelled() for f in [*far, *unsent, plug])
    assert not wait_all([*far, *unsent, plug])


def test_cancel_racing_with_workers_taking_jobs_always_reaches_waiters(make_scheduler):
    # Jobs become due while the test cancels them: each cancel either wins (the job is
    # still in the heap) or loses (a worker took it, and it will complete). Either way
    # every waiter must hear of every future.
    # Due times spread over 40 ms, cancelled latest first: on this machine about half of
    # the cancels win, the rest meet jobs the workers already took.
    s = make_scheduler(workers=2)
    for _ in range(3):
        futures = [s.schedule(jobs.noop, i, delay=0.0002 * i) for i in range(200)]
        s.stats()  # all in the heap: the cancels race the workers, not the outbox
        results = [f.cancel() for f in reversed(futures)][::-1]
        assert not wait_all(futures)
        assert set(as_completed(futures, timeout=WAIT)) == set(futures)
        for i, (future, cancelled) in enumerate(zip(futures, results, strict=True)):
            assert future.cancelled() == cancelled
            if not cancelled:
                assert future.result() == i


def test_cancelling_twice_or_after_completion_does_not_notify_again(make_scheduler):
    s = make_scheduler(workers=1)
    later = s.schedule(abs, -2, delay=3600)
    assert later.cancel() and later.cancel()  # second call: already cancelled, still True
    finished = s.submit(abs, -3)
    assert finished.result(timeout=WAIT) == 3
    assert not finished.cancel()
    assert not wait_all([later, finished])
    plain: Future[int] = Future()  # stdlib futures mixed in are unaffected
    plain.set_result(1)
    assert not wait_all([later, finished, plain])
