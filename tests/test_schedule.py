"""Recurring jobs end to end: Scheduler.every/cron with real worker processes."""

from __future__ import annotations

import concurrent.futures
import itertools
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jobs
import pytest
from processes import wait_for

import mpsched
from mpsched import InvalidJobError, ScheduleNotFoundError, Scheduler

MakeScheduler = Callable[..., Scheduler]


def planned(run_id: str) -> float:
    """The wall-clock slot a run's id names."""
    return datetime.fromisoformat(run_id.rpartition("@")[2].replace("Z", "+00:00")).timestamp()


def spans(log: Path) -> list[tuple[float, float]]:
    if not log.exists():
        return []
    return sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())  # type: ignore[misc]


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_every_runs_ten_times_a_second_without_drift(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2)
    schedule = s.every(0.1, jobs.stamp, start=0.2, id="tick")
    wait_for(lambda: schedule.counters.runs >= 25, what="25 runs")
    runs = schedule.runs(100)
    schedule.cancel()
    assert not concurrent.futures.wait(runs, timeout=30).not_done
    runs = [f for f in runs if not f.cancelled()]  # the run armed when it was cancelled
    offset = time.monotonic() - time.time()  # wall -> monotonic, as the manager maps it
    slots = [planned(f.job_id) for f in runs]
    starts = [f.result()[2] for f in runs]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(slots)}
    # Planned at start + k * 0.1 (a skipped slot would show as a 0.2 step). Without a
    # store too the manager keeps ended jobs for result_ttl: every run is there.
    assert steps <= {0.1, 0.2} and len(runs) >= 25
    lateness = [start - (slot + offset) for start, slot in zip(starts, slots, strict=True)]
    assert min(lateness) > -0.005  # never early (the clocks are read a few µs apart)
    # No cumulative drift: the late runs are not the last ones, whatever the load.
    assert lateness[-1] < 0.1 and sorted(lateness)[len(lateness) // 2] < 0.05


def test_a_slow_job_never_overlaps_itself_with_overlap_skip(
    make_scheduler: MakeScheduler, tmp_path: Path
):
    log = tmp_path / "spans.log"
    s = make_scheduler(workers=2)
    schedule = s.every(0.1, jobs.span, str(log), 0.25, start=0.0)
    wait_for(lambda: len(spans(log)) >= 4, what="4 runs")
    skipped = schedule.counters.skipped
    schedule.cancel()
    done = spans(log)
    assert all(nxt[0] >= prev[1] for prev, nxt in itertools.pairwise(done)), done
    assert skipped >= 2


def test_no_run_starts_after_cancel_returns(make_scheduler: MakeScheduler, tmp_path: Path):
    log = tmp_path / "spans.log"
    s = make_scheduler(workers=2)
    schedule = s.every(0.05, jobs.span, str(log), 0.0, start=0.0, overlap="allow")
    wait_for(lambda: len(spans(log)) >= 3, what="3 runs")
    schedule.cancel()
    cancelled = time.monotonic()
    # A job due 0.3 s later has run: so would have any run planned in between.
    s.schedule(jobs.noop, delay=0.3).result(timeout=30)
    assert all(start < cancelled for start, _ in spans(log))
    with pytest.raises(ScheduleNotFoundError):
        schedule.info()
    assert s.schedules() == []


def test_a_failing_run_does_not_stop_the_schedule(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2)
    schedule = s.every(0.05, jobs.fail, "boom", start=0.0)
    wait_for(lambda: schedule.counters.failed >= 3, what="3 failed runs")
    assert schedule.next_run is not None and not schedule.paused
    first = schedule.runs(10)[0]
    assert isinstance(first.exception(timeout=10), ValueError)


def test_on_error_pause_stops_after_the_first_failure(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2)
    schedule = s.every(0.05, jobs.fail, "boom", start=0.0, on_error="pause")
    wait_for(lambda: schedule.paused, what="the schedule to pause")
    assert schedule.counters.failed == 1 and schedule.next_run is None
    schedule.resume()
    assert schedule.next_run is not None


def test_two_clients_adding_one_schedule_get_one_schedule(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2)
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        mine = s.every(0.05, jobs.stamp, id="shared", start=0.0)
        theirs = other.every(0.05, jobs.stamp, id="shared", start=0.0)
        assert theirs.id == mine.id and [x.id for x in other.schedules()] == ["shared"]
        wait_for(lambda: mine.counters.runs >= 5, what="5 runs")
        ids = [f.job_id for f in theirs.runs(100)]
        assert len(ids) == len(set(ids))
        other.schedules()[0].cancel()  # a connect() client cancels another's schedule
        assert s.schedules() == []
    finally:
        other.detach()


def test_cron_plans_in_its_zone_and_checks_at_the_call_site(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=1)
    schedule = s.cron("30 2 * * 1-5", jobs.noop, tz="Europe/Berlin", id="nightly")
    times = schedule.preview(3)
    assert all(t.strftime("%H:%M") == "02:30" and t.weekday() < 5 for t in times)
    assert str(times[0].tzinfo) == "Europe/Berlin" and schedule.next_run == times[0]
    with pytest.raises(InvalidJobError, match="cron expression"):
        s.cron("30 25 * * *", jobs.noop)
    with pytest.raises(InvalidJobError, match="time zone"):
        s.cron("30 2 * * *", jobs.noop, tz="Europe/Atlantis")
    with pytest.raises(InvalidJobError, match="interval"):
        s.every(0, jobs.noop)
    assert [x.id for x in s.schedules()] == ["nightly"]


def test_info_and_the_handle_give_the_same_aware_next_run(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=1)
    start = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    schedule = s.every(3600, jobs.noop, start=start, id="hourly")
    info = schedule.info()
    assert isinstance(info.next_run, datetime) and info.next_run == start
    assert info.next_run.utcoffset() == timedelta(0) and schedule.next_run == info.next_run
    assert info.next_run_id == "hourly@" + start.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert info.last_run is None
    berlin = s.cron("30 2 * * *", jobs.noop, tz="Europe/Berlin", id="nightly").info()
    assert berlin.next_run is not None and str(berlin.next_run.tzinfo) == "Europe/Berlin"
    assert berlin.next_run.strftime("%H:%M") == "02:30"


def test_cron_without_cronsim_in_the_client_says_so(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
):
    s = make_scheduler(workers=1)  # its manager imports cronsim: it is installed
    monkeypatch.setitem(sys.modules, "cronsim", None)  # but this process cannot import it
    with pytest.raises(
        mpsched.ExtraMissingError,
        match=re.escape(
            "cron schedules need the optional dependency cronsim, missing in this process "
            "(the client): pip install 'mpsched[cron]' there"
        ),
    ):
        s.cron("* * * * *", jobs.noop)
    assert s.schedules() == []


def test_a_schedule_and_its_next_run_survive_a_restart_with_a_store(
    make_scheduler: MakeScheduler, tmp_path: Path
):
    store = str(tmp_path / "jobs.db")
    start = datetime.now(timezone.utc) + timedelta(hours=1)
    with make_scheduler(workers=1, store=store) as s:
        before = s.every(timedelta(hours=24), jobs.noop, start=start, id="daily")
        planned_first = before.next_run
    again = make_scheduler(workers=1, store=store)
    [after] = again.schedules()
    assert after.id == "daily" and after.next_run == planned_first
    assert [j.job_id for j in again.jobs(state="pending")] == [after.info().next_run_id]


@pytest.fixture(params=[False, True], ids=["memory", "store"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """Without a store, then with one."""
    return tmp_path / "jobs.db" if request.param else None


def test_an_ended_runs_future_is_done_when_runs_returns_it(
    make_scheduler: MakeScheduler, store: Path | None
):
    s = make_scheduler(workers=1, store=store)
    schedule = s.every(3600, jobs.stamp, "first", start=0.0, id="hourly")
    # Once the first run has ended, the next one (an hour away) is armed.
    wait_for(lambda: len(schedule.runs(2)) == 2, what="the first run to end")
    ended, armed = schedule.runs(2)
    assert ended.done() and ended.result()[0] == "first" and not armed.done()
    by_id = s.job(ended.job_id)
    assert by_id.done() and by_id.result() == ended.result()


def test_a_cancelled_schedules_latest_runs_stay_listable_and_done(
    make_scheduler: MakeScheduler, store: Path | None
):
    s = make_scheduler(workers=2, store=store)
    schedule = s.every(0.05, jobs.stamp, start=0.0, id="tick")
    wait_for(lambda: schedule.counters.runs >= 3, what="3 runs")
    schedule.cancel()
    first = schedule.runs(5)
    assert len(first) >= 3
    assert not concurrent.futures.wait(first, timeout=30).not_done  # a run under way ends
    again = schedule.runs(5)  # every run has ended: each future is done as it comes
    assert [f.job_id for f in again] == [f.job_id for f in first]
    assert all(f.done() for f in again)
    assert [f.cancelled() for f in again] == [f.cancelled() for f in first]
    assert [f.result() for f in again if not f.cancelled()] == [
        f.result() for f in first if not f.cancelled()
    ]
    by_id = s.job(first[0].job_id)
    assert by_id.done() and by_id.result() == first[0].result()


def test_cancel_is_idempotent_across_handles_of_one_id(
    make_scheduler: MakeScheduler, store: Path | None
):
    s = make_scheduler(workers=1, store=store)
    a = s.every(3600, jobs.noop, id="x")
    b = s.every(3600, jobs.noop, id="x")  # the same spec: an upsert, one schedule
    assert a.cancel() is True
    assert b.cancel() is False and a.cancel() is False
    with pytest.raises(ScheduleNotFoundError, match="'x' was cancelled"):
        b.info()
    assert s.schedules() == []


def test_a_cancelled_schedule_is_forgotten_after_result_ttl_and_cancel_still_holds(
    make_scheduler: MakeScheduler, store: Path | None
):
    s = make_scheduler(workers=1, store=store, result_ttl=0)
    schedule = s.every(3600, jobs.noop, id="x")
    assert schedule.cancel() is True
    with pytest.raises(ScheduleNotFoundError, match="never added, or cancelled and forgotten"):
        schedule.runs()
    assert schedule.cancel() is False  # the manager has forgotten it: still not an error


def test_handles_to_one_schedule_id_are_equal(make_scheduler: MakeScheduler, store: Path | None):
    s = make_scheduler(workers=1, store=store)
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        a = s.every(3600, jobs.noop, id="x")
        b = s.every(3600, jobs.noop, id="x")
        theirs = other.every(3600, jobs.noop, id="x")
        y = s.every(3600, jobs.noop, id="y")
        assert a == b == theirs == s.schedules()[0] == other.schedules()[0]
        assert hash(a) == hash(b) == hash(theirs)
        assert a != y and len({a, b, theirs, y}) == 2 and a != "x"
    finally:
        other.detach()
