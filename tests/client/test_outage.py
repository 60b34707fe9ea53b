"""A client that loses its manager, against fake managers whose connection the test cuts.

What a real SIGKILL and restart look like end to end is tests/test_reconnect.py's; here each
step of an outage is held where the test wants it: a batch on its way when the connection
is cut (and whether it landed), a manager that is still away for a few tries, one that
refuses the client.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import jobs
import pytest
from processes import wait_for

import mpsched
from mpsched import Client, ManagerConnectionLostError, SchedulerShutdownError
from mpsched._core.job import JobRequest, Outcome, PayloadOptions

WAIT = 30.0
ADDRESS = ("127.0.0.1", 7)  # what the errors name; nothing is connected to
WHERE = "127.0.0.1:7"


def done(job_id: str, value: Any) -> Outcome:
    return Outcome(job_id, True, pickle.dumps(value), "", None, "")


class FakeManager:
    """Answers a client's calls in this process until :meth:`cut`; every call after raises
    EOFError, as through the connection of a manager that was killed."""

    def __init__(self, *, store: bool, known: dict[str, Outcome | None] | None = None) -> None:
        self.store = store
        # The jobs it knows (with a store, from before a restart), and their outcomes.
        self.known: dict[str, Outcome | None] = dict(known or {})
        self.submitted: list[list[str]] = []
        self.watched: list[str] = []
        self.opened: list[str] = []  # the client ids that opened here
        self.discarded = threading.Event()
        # Guards _outcomes and _cut; collect() waits on _changed for either.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._outcomes: list[Outcome] = []
        self._cut = False
        self._closed = False
        # A submit waits for this before it is answered (set: at once).
        self.hold = threading.Event()
        self.hold.set()
        self.submitting = threading.Semaphore(0)  # released when a submit arrives
        # The next submit is answered by a cut instead, after landing here (or not).
        self.cut_at_submit: bool | None = None

    manager_address = ADDRESS

    def _check(self) -> None:
        with self._lock:
            if self._cut:
                raise EOFError

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._changed.notify_all()

    def post(self, outcome: Outcome) -> None:
        with self._lock:
            self._outcomes.append(outcome)
            self._changed.notify_all()

    def open_client(self, hello: Any) -> None:
        self._check()
        self.opened.append(hello.client_id)

    def open_connection(self, thread_name: str) -> object:
        self._check()
        return object()  # calls go to this object, whichever thread makes them

    def use_connection(self, connection: object) -> None:
        pass

    def payload_options(self) -> PayloadOptions:
        return PayloadOptions("", b"", None)

    def stats(self) -> Any:
        self._check()
        return SimpleNamespace(store="/srv/jobs.db" if self.store else "memory")

    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[Outcome] | None:
        with self._lock:
            self._changed.wait_for(lambda: self._outcomes or self._cut or self._closed, timeout)
            if self._cut:
                raise EOFError
            if self._closed and not self._outcomes:
                return None
            outcomes, self._outcomes = self._outcomes, []
            return outcomes

    def submit(self, requests: list[JobRequest], timeout: float | None, withdrawn: int = 0) -> None:
        self.submitting.release()
        assert self.hold.wait(WAIT)
        self._check()
        ids = [r.job_id for r in requests]
        if self.cut_at_submit is not None:
            if self.cut_at_submit:  # it landed; the reply is lost
                self.known.update(dict.fromkeys(ids))
                self.submitted.append(ids)
            self.cut()
            raise EOFError
        self.known.update(dict.fromkeys(ids))
        self.submitted.append(ids)

    def watch_many(self, client_id: str, job_ids: list[str]) -> tuple[list[Outcome], list[str]]:
        self._check()
        self.watched += job_ids
        outcomes = [o for j in job_ids if (o := self.known.get(j)) is not None]
        return outcomes, [j for j in job_ids if j not in self.known]

    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        self._check()
        return False

    def close_client(self, client_id: str) -> None:
        self._check()
        with self._lock:
            self._closed = True
            self._changed.notify_all()

    def discard(self) -> None:
        self.discarded.set()


class Comeback:
    """The client's way back to the address: refused until ``manager`` is set."""

    def __init__(self) -> None:
        self.manager: FakeManager | None = None
        self.tries = 0
        self.refusal: BaseException = ConnectionRefusedError(111, "Connection refused")

    def __call__(self) -> FakeManager:
        self.tries += 1
        if self.manager is None:
            raise self.refusal
        return self.manager


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    """Clients of fake managers; each is detached (its threads stopped) at the end."""
    made: list[Client] = []

    def make(manager: FakeManager, comeback: Comeback | None, **options: Any) -> Client:
        made.append(Client(manager, reconnect=comeback, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for client in made:
        client.detach()
        assert not client._core._thread.is_alive()


def test_with_a_store_outstanding_futures_wait_out_the_outage_and_resolve_by_id(
    clients: Callable[..., Client],
) -> None:
    first, comeback = FakeManager(store=True), Comeback()
    client = clients(first, comeback)
    early = client.submit(jobs.noop, 1)
    late = client.submit(jobs.noop, 2)
    client.stats()  # both reached the manager
    first.cut()
    wait_for(lambda: client._core.link.outage is not None, WAIT, "the client noticed")
    with pytest.raises(
        ManagerConnectionLostError, match=f"manager at {WHERE} .*nothing was sent"
    ) as refused:
        client.submit(jobs.noop, 3)
    assert isinstance(refused.value, SchedulerShutdownError)  # as it was before
    assert first.submitted == [[early.job_id, late.job_id]]  # the refused one never went
    with pytest.raises(ManagerConnectionLostError):
        client.stats()
    assert not early.done() and not late.done()

    # Restarted on its store: it knows both jobs; the first ended while the client was away.
    second = FakeManager(
        store=True, known={early.job_id: done(early.job_id, "early"), late.job_id: None}
    )
    comeback.manager = second
    assert early.result(WAIT) == "early"
    wait_for(lambda: client._core.link.outage is None, WAIT, "the client is back")
    assert second.opened == [client._core.client_id]  # under its own id
    assert sorted(second.watched) == sorted([early.job_id, late.job_id])
    assert first.discarded.is_set()
    second.post(done(late.job_id, "late"))
    assert late.result(WAIT) == "late"
    again = client.submit(jobs.noop, 4)
    client.stats()
    assert second.submitted == [[again.job_id]]


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "never-got-it"])
def test_a_batch_whose_reply_was_lost_is_sent_again_only_if_the_manager_never_got_it(
    clients: Callable[..., Client], landed: bool
) -> None:
    first, comeback = FakeManager(store=True), Comeback()
    client = clients(first, comeback)
    first.hold.clear()
    on_its_way = client.submit(jobs.noop, 1)
    assert first.submitting.acquire(timeout=WAIT)  # the sender is in its call
    unsent = client.submit(jobs.noop, 2)  # queued behind it
    first.cut_at_submit = landed
    first.hold.set()
    wait_for(lambda: client._core.link.outage is not None, WAIT, "the client noticed")
    second = FakeManager(
        store=True, known=dict.fromkeys([on_its_way.job_id] if landed else [])
    )  # its store has what landed
    comeback.manager = second
    wait_for(lambda: client._core.link.outage is None, WAIT, "the client is back")
    client.stats()  # what the outbox held has been sent
    again = [] if landed else [on_its_way.job_id]
    sent = [job_id for batch in second.submitted for job_id in batch]
    assert sent == [*again, unsent.job_id]  # the batch in doubt first
    assert on_its_way.job_id in second.watched
    assert unsent.job_id not in second.watched  # never sent: nothing to ask about
    for future in (on_its_way, unsent):
        second.post(done(future.job_id, future.job_id))
        assert future.result(WAIT) == future.job_id


def test_without_a_store_what_was_outstanding_fails_and_new_submits_work_once_back(
    clients: Callable[..., Client],
) -> None:
    first, comeback = FakeManager(store=False), Comeback()
    client = clients(first, comeback)
    sent = client.submit(jobs.noop, 1)
    client.stats()
    assert first.submitting.acquire(timeout=WAIT)  # that one's submit
    first.hold.clear()
    on_its_way = client.submit(jobs.noop, 2)
    assert first.submitting.acquire(timeout=WAIT)
    unsent = client.submit(jobs.noop, 3)
    first.cut()
    first.hold.set()
    for future, says in (
        (sent, "may have run"),
        (on_its_way, "may have reached"),
        (unsent, "never sent, and did not run"),
    ):
        error = future.exception(WAIT)
        assert isinstance(error, ManagerConnectionLostError), error
        assert error.address == WHERE and error.reason == "EOFError"
        assert says in str(error), error
    assert first.submitted == [[sent.job_id]]
    second = FakeManager(store=False)
    comeback.manager = second
    wait_for(lambda: client._core.link.outage is None, WAIT, "the client is back")
    assert second.watched == []  # nothing to ask a manager without a store about
    fresh = client.submit(jobs.noop, 4)
    second.post(done(fresh.job_id, "fresh"))
    assert fresh.result(WAIT) == "fresh"
    assert second.submitted == [[fresh.job_id]]  # the failed ones were not sent again


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_one_warning_per_outage_however_many_tries_it_takes(
    clients: Callable[..., Client], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mpsched.client")
    managers = [FakeManager(store=True) for _ in range(3)]
    comeback = Comeback()
    client = clients(managers[0], comeback)
    for lost, back in itertools.pairwise(managers):
        tries = comeback.tries
        lost.cut()
        wait_for(
            lambda: comeback.tries >= tries + 3,  # noqa: B023 (called at once)
            WAIT,
            "three tries refused",
        )
        comeback.manager = back
        wait_for(lambda: back.opened, WAIT, "the client is back")  # noqa: B023 (at once)
        wait_for(lambda: client._core.link.outage is None, WAIT, "the outage ended")
        comeback.manager = None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if "reconnected to the manager" in r.getMessage()]
    assert len(warnings) == 2 and len(infos) == 2, caplog.text
    assert all(
        f"lost the connection to the manager at {WHERE} (EOFError); reconnecting" in r.getMessage()
        for r in warnings
    )


def test_a_client_closed_during_an_outage_stops_trying_and_fails_what_it_waited_for(
    clients: Callable[..., Client],
) -> None:
    first, comeback = FakeManager(store=True), Comeback()
    client = clients(first, comeback)
    waiting = client.submit(jobs.noop, 1)
    client.stats()
    first.cut()
    wait_for(lambda: comeback.tries >= 1, WAIT, "a try refused")
    client.detach()
    assert not client._core._thread.is_alive()  # it did not wait out its back-off
    error = waiting.exception(WAIT)
    assert isinstance(error, ManagerConnectionLostError)
    assert "closed, so it does not reconnect" in str(error)
    assert "look them up by id" in str(error)  # the store keeps the job
    tries = comeback.tries
    with pytest.raises(SchedulerShutdownError, match="after shutdown"):
        client.submit(jobs.noop, 2)
    assert comeback.tries == tries


def test_a_manager_that_refuses_the_client_ends_its_reconnecting(
    clients: Callable[..., Client], caplog: pytest.LogCaptureFixture
) -> None:
    first, comeback = FakeManager(store=True), Comeback()
    comeback.refusal = mpsched.AuthenticationError("wrong authkey?")
    client = clients(first, comeback)
    waiting = client.submit(jobs.noop, 1)
    client.stats()
    first.cut()
    error = waiting.exception(WAIT)
    assert isinstance(error, ManagerConnectionLostError)
    assert "refused this client: wrong authkey?" in str(error)
    with pytest.raises(ManagerConnectionLostError, match="refused this client"):
        client.submit(jobs.noop, 2)  # not "after shutdown": nobody shut it down
    assert comeback.tries == 1
    assert "stops reconnecting" in caplog.text


def test_a_client_that_cannot_reconnect_says_so_to_its_futures_and_submits(
    clients: Callable[..., Client],
) -> None:
    first = FakeManager(store=True)
    client = clients(first, None, lost_advice="start a new one")
    waiting = client.submit(jobs.noop, 1)
    client.stats()
    first.cut()
    error = waiting.exception(WAIT)
    assert isinstance(error, ManagerConnectionLostError)
    assert (
        str(error) == f"lost the connection to the manager at {WHERE} (EOFError); start a new one"
    )
    with pytest.raises(ManagerConnectionLostError, match=r"start a new one$"):
        client.submit(jobs.noop, 2)
