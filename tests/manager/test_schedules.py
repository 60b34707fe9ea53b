"""The manager's schedules (mpsched._manager.schedules) in-process, on a fake clock: runs armed at
their slots, overlap, cancel, pause, errors, upsert, jitter, wall-clock jumps, and recovery
from a store. Workers are played by calling the service's take/finish directly."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fakeclock import FakeClock

from mpsched._core.job import Outcome, OutcomeKind
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.planning import jitter_offset
from mpsched._core.queue import JobQueue
from mpsched._core.recurring import ScheduleKind, ScheduleSpec, run_id
from mpsched._errors import ExtraMissingError, JobNotFoundError, ScheduleNotFoundError
from mpsched._manager.schedules import Schedules
from mpsched._manager.service import ManagerService
from mpsched._manager.store_journal import Journal
from mpsched._protocol.codec import (
    assignment_from_wire,
    outcome_from_wire,
    report_to_wire,
)
from mpsched._protocol.records import (
    ClientHello,
    Report,
    WorkerHello,
)
from mpsched._store.base import DAY, StoredSchedule
from mpsched._store.sqlite import SQLiteStore
from mpsched._transport.sockets import describe_versions

WORKERS = ("w1", "w2", "w3")
KEPT_CANCELLED = 1000  # cancelled schedules a manager remembers, as the README says


def spec(**changes: Any) -> ScheduleSpec:
    base = ScheduleSpec(
        "s",
        ScheduleKind.EVERY,
        10.0,
        Mode.RATE,
        "",
        "",
        5.0,
        None,
        0.0,
        Overlap.SKIP,
        Catchup.LATEST,
        OnError.CONTINUE,
        2,
        None,
        0,
        "m:f",
        b"payload",
    )
    return base._replace(**changes)


def make_service(
    clock: FakeClock, store: SQLiteStore | None = None, max_pending: int | None = None
) -> ManagerService:
    queue = JobQueue(clock=clock, max_pending=max_pending)
    journal = None if store is None else Journal(store, queue, wall=clock.wall)
    service = ManagerService(queue, clock=clock, journal=journal)
    python, cp = describe_versions()
    for worker_id in WORKERS:
        service.hello(WorkerHello(worker_id, os.getpid(), "elsewhere", python, cp, True, ""))
    return service


def open_store(tmp_path: Path, clock: FakeClock) -> SQLiteStore:
    return SQLiteStore(tmp_path / "jobs.db", durability="process", clock=clock.wall)


@contextlib.contextmanager
def restarted(
    tmp_path: Path, clock: FakeClock, summary: list[str] | None = None
) -> Iterator[ManagerService]:
    """A manager started again on the store: its jobs and schedules recovered (the
    schedules' summary line appended to ``summary``)."""
    store = open_store(tmp_path, clock)
    service = make_service(clock, store)
    try:
        service.journal.recover(clock)
        line = service.schedules.recover()
        if summary is not None:
            summary.append(line)
        yield service
    finally:
        service.stop()
        store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service(clock: FakeClock) -> Iterator[ManagerService]:
    service = make_service(clock)
    yield service
    service.stop()


class Run:
    def __init__(self, job_id: str, lease_id: int) -> None:
        self.job_id, self.lease_id = job_id, lease_id


def take(service: ManagerService, worker: str = "w1") -> Run | None:
    wires = service.take(worker, None, 0)
    if not wires:
        return None
    assignment = assignment_from_wire(wires[0])
    return Run(assignment.lease.job_id, assignment.lease.lease_id)


def finish(service: ManagerService, run: Run, worker: str = "w1", ok: bool = True) -> None:
    outcome = Outcome(run.job_id, ok, pickle.dumps(7 if ok else ValueError("no")), "", None)
    service.finish(worker, [report_to_wire(Report(run.lease_id, outcome))])


def slot(clock: FakeClock, seconds_from_now: float) -> str:
    return run_id("s", round(clock.wall() + seconds_from_now, 6))


def test_runs_start_at_their_slots_and_the_next_is_armed_when_one_ends(
    service: ManagerService, clock: FakeClock
):
    first, second = slot(clock, 5), slot(clock, 15)
    service.add_schedule(tuple(spec()))
    clock.advance(4.9)
    assert take(service) is None
    clock.advance(0.1)
    run = take(service)
    assert run is not None and run.job_id == first
    finish(service, run)
    clock.advance(9.9)
    assert take(service) is None
    clock.advance(0.1)
    run = take(service)
    assert run is not None and run.job_id == second
    assert service.schedule_control("s", "info").counters.runs == 2


def test_overlap_skip_runs_nothing_while_the_previous_run_is_running(
    service: ManagerService, clock: FakeClock
):
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(service)
    assert run is not None
    clock.advance(25)  # two slots pass while it runs
    assert take(service, "w2") is None
    finish(service, run)
    info = service.schedule_control("s", "info")
    assert info.counters.skipped == 2 and info.counters.runs == 1
    clock.advance(5)
    nxt = take(service, "w2")
    assert info.next_run is not None and nxt is not None
    assert nxt.job_id == run_id("s", info.next_run.timestamp()) == info.next_run_id


def test_overlap_allow_arms_the_next_run_when_one_starts(service: ManagerService, clock: FakeClock):
    service.add_schedule(tuple(spec(overlap="allow")))
    clock.advance(5)
    first = take(service)
    clock.advance(10)
    second = take(service, "w2")
    assert first is not None and second is not None and first.job_id != second.job_id


def test_overlap_queue_runs_the_latest_late_slot_when_the_previous_run_ends(
    service: ManagerService, clock: FakeClock
):
    latest = slot(clock, 35)
    service.add_schedule(tuple(spec(overlap="queue")))
    clock.advance(5)
    run = take(service)
    assert run is not None
    clock.advance(32)
    finish(service, run)
    nxt = take(service)
    assert nxt is not None and nxt.job_id == latest
    assert service.schedule_control("s", "info").counters.missed == 2


def test_cancel_withdraws_the_armed_run_and_a_running_one_finishes(
    service: ManagerService, clock: FakeClock
):
    service.add_schedule(tuple(spec(overlap="allow")))
    clock.advance(5)
    running = take(service)
    assert running is not None and len(service.queue) == 1  # the next one
    service.schedule_control("s", "cancel")
    assert len(service.queue) == 0
    finish(service, running)
    clock.advance(100)
    assert take(service) is None
    with pytest.raises(ScheduleNotFoundError):
        service.schedule_control("s", "info")


def test_pause_withdraws_and_resume_plans_from_now_on(service: ManagerService, clock: FakeClock):
    service.add_schedule(tuple(spec()))
    info = service.schedule_control("s", "pause")
    assert info.paused and info.next_run is None
    clock.advance(100)
    assert take(service) is None
    info = service.schedule_control("s", "resume")
    assert info.counters.skipped == info.counters.missed == 0  # a pause is not a backlog
    clock.advance(9.99)
    run = take(service)
    assert info.next_run is not None and run is not None
    assert run.job_id == run_id("s", info.next_run.timestamp()) == info.next_run_id


@pytest.mark.parametrize("on_error", ["continue", "pause"])
def test_a_failed_run_is_counted_and_on_error_decides_what_follows(
    service: ManagerService, clock: FakeClock, on_error: str
):
    service.add_schedule(tuple(spec(on_error=on_error)))
    clock.advance(5)
    run = take(service)
    assert run is not None
    finish(service, run, ok=False)
    info = service.schedule_control("s", "info")
    assert info.counters.failed == 1
    assert info.paused is (on_error == "pause")
    clock.advance(10)
    assert (take(service) is None) is (on_error == "pause")


def test_adding_the_same_spec_again_changes_nothing(service: ManagerService, clock: FakeClock):
    first = service.add_schedule(tuple(spec()))
    clock.advance(1)
    again = service.add_schedule(tuple(spec()))  # a program started again: same spec
    assert again == first and len(service.list_schedules()) == 1
    assert len(service.queue) == 1


def test_a_changed_spec_replaces_the_schedule_and_keeps_its_counters(
    service: ManagerService, clock: FakeClock
):
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(service)
    assert run is not None
    finish(service, run)
    replaced = service.add_schedule(tuple(spec(interval=60.0)))
    assert replaced.spec == "every 60s (rate)" and replaced.counters.runs == 1
    assert len(service.queue) == 1  # the old armed run was withdrawn
    assert len(service.list_schedules()) == 1


def test_jitter_delays_each_run_by_its_own_fixed_offset(service: ManagerService, clock: FakeClock):
    label = round(clock.wall() + 5, 6)
    offset = jitter_offset("s", label, 3.0)
    assert offset > 0.01
    service.add_schedule(tuple(spec(jitter=3.0)))
    clock.advance(5 + offset - 0.01)
    assert take(service) is None
    clock.advance(0.01)
    run = take(service)
    assert run is not None and run.job_id == run_id("s", label)


def test_cron_runs_move_when_the_wall_clock_jumps(service: ManagerService, clock: FakeClock):
    clock.wall_offset = 1_800_000_000 - clock.now() - 1  # 1 s before a whole half hour
    service.add_schedule(
        tuple(spec(kind="cron", interval=0.0, cron="*/30 * * * *", tz="UTC", start_delay=None))
    )
    clock.wall_offset -= 600  # the wall clock is set back 10 minutes
    assert service.schedules.events.remap_cron() == 1
    clock.advance(1)
    assert take(service) is None  # by the wall clock the slot is 10 minutes away
    clock.advance(600)
    run = take(service)
    assert run is not None and run.job_id == run_id("s", 1_800_000_000)


def test_info_gives_the_next_run_as_an_aware_datetime_and_its_job_id(
    service: ManagerService, clock: FakeClock
):
    first = slot(clock, 5)
    info = service.add_schedule(tuple(spec()))
    assert info.next_run == datetime.fromtimestamp(round(clock.wall() + 5, 6), timezone.utc)
    assert info.next_run.tzinfo is not None and info.next_run_id == first
    assert info.last_run is None  # armed is not run: nothing has started yet
    clock.advance(5)
    run = take(service)
    assert run is not None and run.job_id == first
    info = service.schedule_control("s", "info")
    assert info.last_run == first and info.next_run_id is None  # skip: none armed yet
    finish(service, run)
    info = service.schedule_control("s", "info")
    assert info.last_run == first and info.next_run_id == slot(clock, 10)


def test_a_cron_schedule_s_next_run_is_in_its_zone(service: ManagerService, clock: FakeClock):
    clock.wall_offset = 1_800_000_000 - clock.now() - 1
    info = service.add_schedule(
        tuple(
            spec(
                kind="cron", interval=0.0, cron="*/30 * * * *", tz="Europe/Berlin", start_delay=None
            )
        )
    )
    assert info.next_run is not None and str(info.next_run.tzinfo) == "Europe/Berlin"
    assert info.next_run.timestamp() == 1_800_000_000


def test_the_manager_names_itself_when_it_lacks_cronsim(
    service: ManagerService, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "cronsim", None)  # import cronsim fails here
    with pytest.raises(ExtraMissingError) as caught:
        service.add_schedule(
            tuple(spec(kind="cron", interval=0.0, cron="* * * * *", start_delay=None))
        )
    assert f"missing in the manager (pid {os.getpid()} on {socket.gethostname()})" in str(
        caught.value
    )
    assert "pip install 'mpsched[cron]'" in str(caught.value)
    assert pickle.loads(pickle.dumps(caught.value)).args == caught.value.args  # it travels
    assert service.list_schedules() == []


def test_the_latest_run_started_survives_a_restart(tmp_path: Path, clock: FakeClock):
    store = open_store(tmp_path, clock)
    before = make_service(clock, store)
    before.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(before)
    assert run is not None
    finish(before, run)
    before.stop()
    store.close()
    with restarted(tmp_path, clock) as after:
        assert after.schedule_control("s", "info").last_run == run.job_id


def test_a_schedule_state_stored_before_last_run_was_kept_still_loads(
    tmp_path: Path, clock: FakeClock
):
    store = open_store(tmp_path, clock)
    before = make_service(clock, store)
    armed = slot(clock, 5)
    before.add_schedule(tuple(spec()))
    [stored] = store.schedules()
    before.stop()
    older = tuple(pickle.loads(stored.state))[:-1]  # a state without last_started
    store.update_schedule("s", pickle.dumps(older))
    store.close()
    with restarted(tmp_path, clock) as after:
        info = after.schedule_control("s", "info")
        assert info.last_run is None and info.next_run_id == armed


def test_runs_keep_their_outcome_without_a_store(service: ManagerService, clock: FakeClock):
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(service)
    assert run is not None
    finish(service, run)
    kept = service.schedules.outcome(run.job_id)
    assert kept is not None and kept.ok and pickle.loads(kept.payload) == 7
    assert service.schedule_runs("s", 10) == [run.job_id, slot(clock, 10)]


def test_downtime_is_caught_up_once_and_no_slot_runs_twice(tmp_path: Path, clock: FakeClock):
    store = open_store(tmp_path, clock)
    before = make_service(clock, store)
    armed = slot(clock, 5)
    before.add_schedule(tuple(spec()))
    before.stop()  # the manager goes down with its first run armed
    store.close()

    clock.advance(40)  # slots at 5, 15, 25, 35 pass while it is down
    with restarted(tmp_path, clock) as after:
        info = after.schedule_control("s", "info")
        assert info.counters.missed == 3  # the armed run stands for the other three
        run = take(after)
        assert run is not None and run.job_id == armed
        finish(after, run)
        nxt = take(after)
        assert nxt is None and after.schedule_control("s", "info").counters.runs == 1
        assert [j.job_id for j in after.jobs()].count(armed) == 1


def test_a_stale_state_never_arms_a_slot_twice(tmp_path: Path, clock: FakeClock):
    store = open_store(tmp_path, clock)
    before = make_service(clock, store)
    before.add_schedule(tuple(spec()))
    [stored] = store.schedules()
    before.stop()
    # As if the manager died after the run was journalled but before its state was.
    fresh = (
        Schedules(before.journal, clock, lambda ids: None)
        ._entry(spec(), pickle.loads(stored.state)[0], "")
        .state()
    )
    store.update_schedule("s", pickle.dumps(fresh))
    store.close()

    with restarted(tmp_path, clock) as after:
        assert len(after.queue) == 1
        assert len(after.jobs()) == 1
        info = after.schedule_control("s", "info")  # the run found is the armed one
        assert info.counters.missed == 0 and info.next_run_id == after.jobs()[0].job_id
        clock.advance(5)
        run = take(after)
        assert run is not None
        finish(after, run)
        assert len(after.queue) == 1  # and its end armed the next


def test_a_schedule_survives_a_restart_with_its_spec(tmp_path: Path, clock: FakeClock):
    store = open_store(tmp_path, clock)
    first = make_service(clock, store)
    first.add_schedule(tuple(spec(schedule_id="nightly", interval=86400.0)))
    first.stop()
    store.close()
    summary: list[str] = []
    with restarted(tmp_path, clock, summary) as again:
        assert summary == ["recovered 1 schedule(s)"]
        [info] = again.list_schedules()
        assert info.schedule_id == "nightly" and info.spec == "every 86400s (rate)"
        [stored] = again.journal.store.schedules()
        assert isinstance(stored, StoredSchedule) and stored.schedule_id == "nightly"


def test_a_run_that_could_not_be_queued_is_planned_again(clock: FakeClock):
    service = make_service(clock, max_pending=1)
    try:
        service.submit([("blocker", "c", b"", 2, 3600.0, None, None, 0, None, "m:g")], 0)
        first = slot(clock, 5)
        service.add_schedule(tuple(spec()))
        assert len(service.queue) == 1  # the queue was full: the run is not queued
        service.schedules.events.replan_stalled()
        assert len(service.queue) == 1  # still full: nothing changes
        service.cancel("blocker")
        service.schedules.events.replan_stalled()  # the watcher does so every second
        assert len(service.queue) == 1
        clock.advance(5)
        run = take(service)
        assert run is not None and run.job_id == first
        assert service.schedule_control("s", "info").counters.missed == 0
    finally:
        service.stop()


def test_skipped_slots_are_logged_at_once_then_at_most_once_a_minute(
    service: ManagerService, clock: FakeClock, caplog: pytest.LogCaptureFixture
):
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    for _ in range(2):  # each run takes 2.5 intervals: ends at 30, then at 60
        run = take(service)
        assert run is not None
        clock.advance(25)
        finish(service, run)
        clock.advance(5)
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warnings == [
        "schedule s: 2 slot(s) skipped: the previous run was still pending "
        "or running (overlap='skip')"
    ]
    run = take(service)
    assert run is not None
    clock.advance(25)
    finish(service, run)  # at 90, a minute after the first warning
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert warnings[1].startswith("schedule s: 4 slot(s) skipped")  # 2 + 2 since then
    assert service.schedule_control("s", "info").counters.skipped == 6


def test_a_replaced_schedule_warns_on_from_what_was_already_said(
    service: ManagerService, clock: FakeClock, caplog: pytest.LogCaptureFixture
):
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    said = []
    for replace in (False, True, False):  # each run takes 2.5 intervals: ends at 30, 60, 90
        run = take(service)
        assert run is not None
        if replace:  # while its run runs: the new spec takes over the run and counters
            service.add_schedule(tuple(spec(payload=b"another payload")))
        clock.advance(25)
        finish(service, run)
        clock.advance(5)
        said.append(
            [r.getMessage().split(":")[1] for r in caplog.records if "skipped" in r.getMessage()]
        )
        caplog.clear()
    # At 30; nothing at 60, within the minute; at 90, what was skipped since 30.
    assert said == [[" 2 slot(s) skipped"], [], [" 4 slot(s) skipped"]]
    assert service.schedule_control("s", "info").counters.skipped == 6


def test_a_cron_run_is_never_handed_out_before_its_wall_clock_time(
    service: ManagerService, clock: FakeClock
):
    clock.wall_offset = 1_800_000_000 - clock.now() - 1  # 1 s before a whole half hour
    service.add_schedule(
        tuple(spec(kind="cron", interval=0.0, cron="*/30 * * * *", tz="UTC", start_delay=None))
    )
    clock.wall_offset -= 600  # set back 10 minutes, before the watcher has looked
    clock.advance(1)
    assert take(service) is None  # due on the monotonic clock, early on the wall clock
    assert len(service.queue) == 1 and service.queue.stats().in_flight == 0
    clock.advance(599.9)
    assert take(service) is None
    clock.advance(0.1)
    run = take(service)
    assert run is not None and run.job_id == run_id("s", 1_800_000_000)


def test_delay_mode_plans_each_run_an_interval_after_the_previous_one_ended(
    service: ManagerService, clock: FakeClock
):
    service.add_schedule(tuple(spec(mode="delay")))
    clock.advance(5)
    run = take(service)
    assert run is not None
    clock.advance(7)  # it runs for 7 s
    finish(service, run)
    clock.advance(9.99)
    assert take(service) is None
    clock.advance(0.01)
    nxt = take(service)
    assert nxt is not None and nxt.job_id == slot(clock, 0)
    assert service.schedule_control("s", "info").counters.skipped == 0


def test_a_run_is_due_at_its_slot_however_long_queueing_it_takes(
    service: ManagerService, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    submit = service.journal.submit

    def slow_submit(*args: Any, **kwargs: Any) -> Any:
        clock.advance(0.5)  # a store commit, a busy manager: the clock moves meanwhile
        return submit(*args, **kwargs)

    monkeypatch.setattr(service.journal, "submit", slow_submit)
    first = slot(clock, 5)
    service.add_schedule(tuple(spec()))
    clock.advance(4.5)  # 5 s after the add, the clock having moved 0.5 s while queueing
    run = take(service)
    assert run is not None and run.job_id == first


@pytest.fixture(params=["memory", "sqlite"])
def either(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> Iterator[ManagerService]:
    """A manager without a store, then one with a store."""
    store = None if request.param == "memory" else open_store(tmp_path, clock)
    service = make_service(clock, store)
    yield service
    service.stop()
    if store is not None:
        store.close()


def handed(service: ManagerService, job_id: str) -> Outcome | None:
    """The outcome a client watching ``job_id`` is handed at once (None: when it ends).

    Raises:
        JobNotFoundError: the manager knows no such job."""
    wire = service.watch("watcher", job_id)
    return None if wire is None else outcome_from_wire(wire)


def test_watching_an_ended_run_hands_its_outcome_at_once_and_sends_nothing_more(
    either: ManagerService, clock: FakeClock
):
    python, cp = describe_versions()
    either.open_client(ClientHello("watcher", python, cp))
    either.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(either)
    assert run is not None
    assert handed(either, run.job_id) is None  # running: sent when it ends
    finish(either, run)
    [sent] = either.collect("watcher", 0) or []
    assert sent[0] == run.job_id
    ended = handed(either, run.job_id)  # ended: handed with the reply, not sent after it
    assert ended is not None and ended.ok and pickle.loads(ended.payload) == 7
    assert either.collect("watcher", 0) == []


def test_a_runs_outcome_is_kept_before_any_client_hears_that_it_ended(
    service: ManagerService, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    kept_when_posted: list[bool] = []
    post = service.mailboxes.post

    def spy(client_id: str, outcome: Outcome) -> None:
        kept_when_posted.append(service.schedules.outcome(outcome.job_id) is not None)
        post(client_id, outcome)

    monkeypatch.setattr(service.mailboxes, "post", spy)
    service.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(service)
    assert run is not None and handed(service, run.job_id) is None  # a client watches it
    finish(service, run)
    assert kept_when_posted == [True, True]  # its schedule's, then the watcher's


def test_a_cancelled_schedule_keeps_its_runs_and_outcomes_for_result_ttl(
    either: ManagerService, clock: FakeClock
):
    either.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(either)
    assert run is not None
    finish(either, run)
    armed = slot(clock, 10)
    either.schedule_control("s", "cancel")
    assert either.schedule_runs("s", 10) == [run.job_id, armed]
    ended, withdrawn = handed(either, run.job_id), handed(either, armed)
    assert ended is not None and ended.ok and pickle.loads(ended.payload) == 7
    assert withdrawn is not None and withdrawn.error_kind == OutcomeKind.CANCELLED
    clock.advance(DAY - 1)  # the Scheduler's default result_ttl, from the cancel on
    assert either.schedule_runs("s", 1) == [armed]
    clock.advance(1)
    with pytest.raises(ScheduleNotFoundError):
        either.schedule_runs("s", 10)
    if either.journal.store.location == "memory":  # a store keeps runs as its own jobs
        with pytest.raises(JobNotFoundError):
            handed(either, run.job_id)


def test_a_run_under_way_when_its_schedule_is_cancelled_keeps_its_outcome(
    either: ManagerService, clock: FakeClock
):
    either.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(either)
    assert run is not None
    either.schedule_control("s", "cancel")
    finish(either, run)
    assert either.schedule_runs("s", 10) == [run.job_id]
    ended = handed(either, run.job_id)
    assert ended is not None and ended.ok


def test_a_cancel_of_a_cancelled_schedule_says_it_was_cancelled(either: ManagerService):
    either.add_schedule(tuple(spec()))
    assert either.schedule_control("s", "cancel").cancelled
    for action in ("cancel", "info", "pause"):
        with pytest.raises(ScheduleNotFoundError) as again:
            either.schedule_control("s", action)
        assert again.value.cancelled and str(again.value) == "schedule 's' was cancelled"
    assert pickle.loads(pickle.dumps(again.value)).cancelled  # it reaches the client so
    with pytest.raises(ScheduleNotFoundError) as never:
        either.schedule_control("t", "cancel")
    assert not never.value.cancelled and "never added" in str(never.value)
    assert either.list_schedules() == []


def test_the_manager_forgets_the_earliest_cancelled_schedules_beyond_its_bound(
    service: ManagerService,
):
    for i in range(KEPT_CANCELLED + 1):
        service.add_schedule(tuple(spec(schedule_id=f"s{i}", start_delay=3600.0)))
        service.schedule_control(f"s{i}", "cancel")
    with pytest.raises(ScheduleNotFoundError):
        service.schedule_runs("s0", 10)
    assert len(service.schedule_runs("s1", 10)) == 1
    assert len(service.schedule_runs(f"s{KEPT_CANCELLED}", 10)) == 1


def test_a_cancelled_schedule_added_again_starts_afresh_and_lists_its_former_runs(
    either: ManagerService, clock: FakeClock
):
    either.add_schedule(tuple(spec()))
    clock.advance(5)
    run = take(either)
    assert run is not None
    finish(either, run)
    either.schedule_control("s", "cancel")
    info = either.add_schedule(tuple(spec()))
    assert info.counters.runs == 0 and not info.cancelled
    assert either.schedule_runs("s", 10)[0] == run.job_id
    ended = handed(either, run.job_id)
    assert ended is not None and ended.ok
