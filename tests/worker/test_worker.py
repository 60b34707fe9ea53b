"""The worker loop in-process, against a scripted stand-in for the manager's service.

Jobs are real cloudpickled payloads run by ``serve``; time is never waited for: timers are
fakes the test fires by hand.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from mpsched._core.job import Assignment, Lease
from mpsched._errors import SchedulerShutdownError
from mpsched._protocol.records import (
    Report,
)
from mpsched._worker.loop import serve
from mpsched._worker.process import DrainState, JobTimeouts, WorkerConfig


class ScriptedService:
    """Hands out the given assignments, one per take, then says the manager stopped."""

    def __init__(self, assignments: list[Assignment]) -> None:
        self.assignments = list(assignments)
        self.reports: list[Report] = []

    def take(
        self, worker_id: str, reports: list[Report], timeout: float, more: int = 0
    ) -> list[Assignment]:
        self.reports += reports
        if not self.assignments:
            raise SchedulerShutdownError("stopped")
        assignment = self.assignments.pop(0)
        return [] if assignment is None else [assignment]

    def report(self, worker_id: str, reports: list[Report]) -> None:
        self.reports += reports


def assignment(
    lease_id: int, fn: Callable[..., Any], *args: Any, timeout: float | None = None
) -> Assignment:
    payload = cloudpickle.dumps((fn, args, {}))
    # due=None: a remote worker, which never gets the manager's clock.
    return Assignment(Lease(lease_id, f"job-{lease_id}", "w", 1), payload, None, timeout, 0.0)


def config(tmp_path: Path) -> WorkerConfig:
    # Nothing listens there: serve's farewell call fails quietly.
    return WorkerConfig(address=str(tmp_path / "no-manager.sock"), authkey=b"k", worker_id="w")


def outcomes(service: ScriptedService) -> list[tuple[str, Any]]:
    return [(r.outcome.job_id, cloudpickle.loads(r.outcome.payload)) for r in service.reports]


def touch(path: str) -> str:
    Path(path).touch()
    return path


def test_a_remote_worker_whose_ack_fails_treats_it_as_a_lost_manager(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    service = ScriptedService([assignment(1, touch, str(marker))])

    def ack(lease_id: int) -> None:
        raise ConnectionResetError("the manager went away mid-hand-off")

    ended = serve(service, config(tmp_path), ack, DrainState())  # type: ignore[arg-type]
    assert ended == "lost"
    # Never acknowledged, the job counts as never delivered: running it could run it twice.
    assert not marker.exists()


class VanishingService(ScriptedService):
    """A ScriptedService whose manager goes away at the ``vanish_at``-th take (from 0)."""

    def __init__(self, assignments: list[Assignment], vanish_at: int) -> None:
        super().__init__(assignments)
        self.vanish_at = vanish_at
        self.takes: list[tuple[bool, float]] = []  # (carried a report, timeout) per take

    def take(
        self, worker_id: str, reports: list[Report], timeout: float, more: int = 0
    ) -> list[Assignment]:
        self.takes.append((bool(reports), timeout))
        if len(self.takes) > self.vanish_at:
            raise EOFError
        self.reports += reports
        return [self.assignments.pop(0)] if self.assignments else []


@pytest.mark.parametrize(
    ("vanish_at", "says"),
    [
        pytest.param(
            1,
            "the report of job job-1 got no answer: its outcome is lost unless the "
            "manager recorded it",
            id="while-reporting",
        ),
        pytest.param(2, "", id="idle"),
    ],
)
def test_a_remote_worker_hands_in_a_report_without_waiting_and_knows_if_it_was_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, vanish_at: int, says: str
) -> None:
    service = VanishingService([assignment(1, str, "done")], vanish_at)
    with caplog.at_level(logging.WARNING, logger="mpsched.worker"):
        ended = serve(
            service,  # type: ignore[arg-type]
            config(tmp_path),
            lambda lease_id: None,
            DrainState(),
            long_poll=5.0,
        )
    assert ended == "lost"
    # Take the job; hand its report in with a take that returns at once; then wait.
    assert service.takes == [(False, 5.0), (True, 0.0), (False, 5.0)][: vanish_at + 1]
    [lost] = [r.getMessage() for r in caplog.records if "lost its manager" in r.getMessage()]
    assert lost.endswith(f"(EOFError: ){'; ' if says else ''}{says}"), lost


def test_a_local_worker_hands_in_a_report_with_its_long_poll(tmp_path: Path) -> None:
    service = VanishingService([assignment(1, str, "done")], vanish_at=2)
    assert serve(service, config(tmp_path), lambda lease_id: None, long_poll=5.0) == "lost"  # type: ignore[arg-type]
    assert service.takes == [(False, 5.0), (True, 5.0), (False, 5.0)]


# ------------------------------------------------------------------------------ timeouts


class FakeTimer:
    """A threading.Timer that fires only when the test says, even after cancel()."""

    def __init__(
        self, interval: float, function: Callable[..., None], args: tuple[Any, ...] = ()
    ) -> None:
        self.interval, self.function, self.args = interval, function, args
        self.daemon = False
        self.started = self.cancelled = False
        TIMERS.append(self)

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        # A real timer whose function already runs is past cancelling: model the worst case.
        self.cancelled = True

    def fire(self) -> None:
        self.function(*self.args)


TIMERS: list[FakeTimer] = []  # every FakeTimer made, in order; the test's thread alone


@pytest.fixture
def timers() -> list[FakeTimer]:
    TIMERS.clear()
    return TIMERS


def fire_timer(index: int) -> str:
    """A job that makes timer ``index`` go off while it runs."""
    TIMERS[index].fire()
    return f"fired {index}"


def test_a_late_timer_of_a_finished_job_spares_the_next_job(
    tmp_path: Path, timers: list[FakeTimer]
) -> None:
    expired: list[str] = []
    timeouts = JobTimeouts(lambda: expired.append(threading.current_thread().name), timer=FakeTimer)
    service = ScriptedService(
        [
            assignment(1, str, "quick", timeout=5.0),  # its timer fires only after it finished
            assignment(2, fire_timer, 0, timeout=5.0),  # job 1's late timer goes off in here
            assignment(3, fire_timer, 0),  # no timeout of its own
        ]
    )
    ended = serve(
        service,  # type: ignore[arg-type]
        config(tmp_path),
        lambda lease_id: None,
        DrainState(),
        timeouts=timeouts,
    )
    assert ended == "stopped"
    assert outcomes(service) == [("job-1", "quick"), ("job-2", "fired 0"), ("job-3", "fired 0")]
    assert expired == []  # jobs 2 and 3 were innocent
    assert [t.interval for t in timers] == [5.0, 5.0]
    assert all(t.started and t.cancelled and t.daemon for t in timers)


def test_a_job_past_its_timeout_ends_the_worker(tmp_path: Path, timers: list[FakeTimer]) -> None:
    expired: list[str] = []
    timeouts = JobTimeouts(lambda: expired.append("exit"), timer=FakeTimer)
    service = ScriptedService([assignment(1, fire_timer, 0, timeout=0.5)])
    serve(service, config(tmp_path), lambda lease_id: None, DrainState(), timeouts=timeouts)  # type: ignore[arg-type]
    assert expired == ["exit"]  # its own timer, while it ran


# ------------------------------------------------------------------------------ start time


class FakeTime:
    """Stands in for the ``time`` module in mpsched._worker.run: sleeping moves the clock."""

    def __init__(self, now: float, wall: float = 0.0) -> None:
        self.now = now
        self.wall_offset = wall - now  # time.time() is the monotonic clock plus this
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self.wall_offset

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def started(service: ScriptedService) -> float | None:
    [report] = service.reports
    assert report.outcome.ok, report.outcome.traceback
    return report.outcome.started


def test_a_remote_worker_waits_the_managers_delay_from_receipt_on_its_own_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeTime(now=-3600.0)  # nowhere near the manager's clock
    monkeypatch.setattr("mpsched._worker.run.time", clock)
    service = ScriptedService([assignment(1, str, "ran")._replace(delay=0.25)])
    serve(service, config(tmp_path), lambda lease_id: None, DrainState())  # type: ignore[arg-type]
    assert clock.slept == [0.25]
    assert started(service) == -3600.0 + 0.25


def test_a_local_worker_waits_until_the_due_instant_it_shares_with_the_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeTime(now=100.0)
    monkeypatch.setattr("mpsched._worker.run.time", clock)
    # Handed out early: the manager's clock is ours, the instant is what counts.
    early = assignment(1, str, "ran")._replace(due=100.002, delay=0.0015)
    service = ScriptedService([early])
    serve(service, config(tmp_path), lambda lease_id: None)  # type: ignore[arg-type]
    assert started(service) == pytest.approx(100.002)
    assert sum(clock.slept) == pytest.approx(0.002)


def test_a_local_worker_starts_an_at_job_no_sooner_than_its_wall_clock_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Due (on the shared monotonic clock) at 100.002, asked for at wall time 1000.005:
    # the wall clock fell 3 ms behind the monotonic one since the manager mapped it.
    clock = FakeTime(now=100.0, wall=1000.0)
    monkeypatch.setattr("mpsched._worker.run.time", clock)
    early = assignment(1, str, "ran")._replace(due=100.002, delay=0.0015, at=1000.005)
    service = ScriptedService([early])
    serve(service, config(tmp_path), lambda lease_id: None)  # type: ignore[arg-type]
    assert started(service) == pytest.approx(100.005)
    assert clock.time() >= 1000.005


@pytest.mark.parametrize(("last_ms", "more"), [(0.1, 7), (2.0, 7), (5.0, 2), (10.0, 0), (20.0, 0)])
def test_a_local_worker_asks_for_batches_of_cpu_heavy_jobs_of_a_few_ms(
    last_ms: float, more: int
) -> None:
    # Each take costs the manager a wake-up on the cores the jobs need: jobs of a few ms
    # come several at a time, as many as fit in BATCH_TIME (16 ms), up to PREFETCH.
    from mpsched._worker.claims import ClaimSlot
    from mpsched._worker.loop import _Batches

    config = WorkerConfig(address="unused", authkey=b"k", worker_id="w1")
    slot = ClaimSlot(multiprocessing.get_context("spawn"))
    batches = _Batches(config, slot, service=None, remote=False)  # type: ignore[arg-type]
    batches._last_run = last_ms / 1000
    assert batches.more() == more
