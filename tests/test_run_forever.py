"""A script whose work is its schedules: run_forever() keeps it running until SIGTERM or
Ctrl-C; a Scheduler without a store that stops while its manager holds schedules names
them in one warning.

The signals go to real scripts, each in its own session, by pid; the tests wait on the
lines the scripts and their schedules' runs print.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jobs
import pytest
from processes import Lines, Programs, assert_gone

import mpsched
from mpsched import (
    ManagerConnectionLostError,
    NothingToRunError,
    Scheduler,
    SchedulerShutdownError,
)
from mpsched._client import forever
from mpsched._client import scheduler as scheduler_module

pytestmark = pytest.mark.slow

WAIT = 60.0  # a bound for what must happen, far above what it takes on 2 busy cores

# A shell that runs the tests in the background may start them with SIGINT ignored, which
# the scripts would inherit; a script under a terminal gets KeyboardInterrupt.
PREAMBLE = """\
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import jobs
from mpsched import Scheduler
"""

DROPPED = "mpsched: this Scheduler stops its manager, which has no store, so "


class Script:
    """A started script: its output lines, and every process it started."""

    def __init__(self, programs: Programs, source: str) -> None:
        path = programs.script(PREAMBLE + textwrap.dedent(source))
        self.popen = programs.start(str(path))
        self._programs = programs
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self.out, self.err = Lines(self.popen.stdout), Lines(self.popen.stderr)

    def ran_twice(self) -> None:
        """Wait until the schedule's runs printed "tick" twice, the script still running."""
        self.out.until(lambda line: line == "running", WAIT)
        for _ in range(2):
            self.out.until(lambda line: line == "tick", WAIT)
        assert self.popen.poll() is None, self.err.seen

    def family(self) -> list[Any]:
        """The manager, its forkserver and workers: none may outlive the script."""
        family = self._programs.note_descendants(self.popen)
        assert len(family) >= 2, family
        return family

    def send(self, signum: int) -> None:
        os.kill(self.popen.pid, signum)

    def wait(self) -> int:
        try:
            return self.popen.wait(WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {WAIT} s; stderr: {self.err.seen}") from None


# ------------------------------------------------------------------------ run_forever()


def test_sigterm_ends_run_forever_which_shuts_down_and_returns(programs: Programs) -> None:
    script = Script(
        programs,
        """
        def mine(signum, frame):
            print("the program's own handler", flush=True)

        signal.signal(signal.SIGTERM, mine)
        with Scheduler(workers=1) as s:
            print("running", flush=True)  # before the first run can print
            s.every(0.2, jobs.say, "tick", id="tick", start=0)
            s.run_forever()
            print("returned; its handler back:", signal.getsignal(signal.SIGTERM) is mine,
                  flush=True)
        print("left the block", flush=True)
    """,
    )
    script.ran_twice()
    family = script.family()
    script.send(signal.SIGTERM)
    assert script.wait() == 0, script.err.rest()
    said = [line for line in script.out.rest() if line != "tick"]
    assert said == ["returned; its handler back: True", "left the block"], said
    assert script.err.rest() == []  # no traceback, and no warning: the stop was asked for
    assert_gone(family)


def test_ctrl_c_ends_run_forever_as_it_ends_a_with_block(programs: Programs) -> None:
    script = Script(
        programs,
        """
        with Scheduler(workers=1) as s:
            print("running", flush=True)  # before the first run can print
            s.every(0.2, jobs.say, "tick", id="tick", start=0)
            s.schedule(jobs.noop, 1, delay=600)
            try:
                s.run_forever()
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                raise
    """,
    )
    script.ran_twice()
    family = script.family()
    script.send(signal.SIGINT)
    assert script.wait() == -signal.SIGINT  # the KeyboardInterrupt went on, to the end
    assert [line for line in script.out.rest() if line != "tick"] == ["interrupted"]
    errors = script.err.rest()
    assert errors[0] == (
        "mpsched: KeyboardInterrupt stopped run_forever(): cancelled 1 job not started"
    ), errors
    assert errors[-1] == "KeyboardInterrupt", errors
    assert [line for line in errors if line.startswith("mpsched:")] == errors[:1], errors
    assert_gone(family)


@pytest.fixture
def background() -> Iterator[Callable[[Callable[[], Any]], Future[Any]]]:
    """Runs a call in a thread of its own, its outcome in a Future; each thread must have
    ended by the test's end (its Scheduler is stopped first: the tests ask for this
    fixture before make_scheduler)."""
    threads: list[threading.Thread] = []

    def start(call: Callable[[], Any]) -> Future[Any]:
        outcome: Future[Any] = Future()

        def run() -> None:
            try:
                outcome.set_result(call())
            except BaseException as exc:
                outcome.set_exception(exc)

        threads.append(threading.Thread(target=run, daemon=True, name="run_forever"))
        threads[-1].start()
        return outcome

    yield start
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "run_forever() did not return"


@pytest.fixture
def waiting(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a run_forever() is in its wait (its checks passed)."""
    entered = threading.Event()  # set by the wrapper below; the test waits on it
    real = forever.wait_for_stop

    def wait_for_stop(closed: threading.Event) -> bool:
        entered.set()
        return real(closed)

    monkeypatch.setattr(scheduler_module, "wait_for_stop", wait_for_stop)
    return entered


def test_run_forever_with_nothing_to_run_raises_at_once(
    background: Callable[[Callable[[], Any]], Future[Any]], make_scheduler: Callable[..., Scheduler]
) -> None:
    s = make_scheduler(workers=1)
    s.every(600, jobs.noop, id="hourly").cancel()  # cancelled: nothing
    s.submit(jobs.noop).result(timeout=WAIT)  # ended: nothing
    error = background(s.run_forever).exception(timeout=WAIT)
    assert isinstance(error, NothingToRunError) and isinstance(error, RuntimeError), error
    assert str(error).startswith(
        "run_forever() has nothing to run: the manager holds no "
        "schedule and no job pending or running. Add a schedule"
    ), error
    s.shutdown()
    error = background(s.run_forever).exception(timeout=WAIT)
    assert isinstance(error, SchedulerShutdownError), error


def test_from_another_thread_run_forever_sets_no_handler_and_returns_at_shutdown(
    background: Callable[[Callable[[], Any]], Future[Any]],
    make_scheduler: Callable[..., Scheduler],
    waiting: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = make_scheduler(workers=1)
    s.schedule(jobs.noop, 1, delay=0.5)  # a pending job is something to run
    handler = signal.getsignal(signal.SIGTERM)
    returned = background(s.run_forever)
    assert waiting.wait(WAIT)
    assert signal.getsignal(signal.SIGTERM) is handler
    s.shutdown()  # waits for the job, as leaving a with block does
    assert returned.result(timeout=WAIT) is None
    assert not _dropped(caplog)  # it held no schedule


def test_run_forever_raises_when_the_manager_is_lost(
    background: Callable[[Callable[[], Any]], Future[Any]],
    make_scheduler: Callable[..., Scheduler],
    waiting: threading.Event,
) -> None:
    s = make_scheduler(workers=1)
    s.every(600, jobs.noop, id="hourly")
    returned = background(s.run_forever)
    assert waiting.wait(WAIT)
    os.kill(s._manager_process.pid, signal.SIGKILL)
    error = returned.exception(timeout=WAIT)
    assert isinstance(error, ManagerConnectionLostError), error


# ------------------------------------------------------------- schedules that end unsaid


def _dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mpsched.scheduler" and r.levelno == logging.WARNING
    ]


def _named(message: str) -> list[str]:
    """The schedule ids a warning names."""
    return sorted(message.split(" with it: ", 1)[1].split(". ", 1)[0].split(", "))


def test_a_block_that_ends_without_a_store_names_the_schedules_it_drops_once(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    with make_scheduler(workers=1) as s:
        s.every(60, jobs.noop, id="hourly")
        s.every(60, jobs.noop, 2, id="also")
        s.every(60, jobs.noop, 3, id="cancelled").cancel()
    s.shutdown()
    s._closing.at_exit()  # nor at the interpreter's exit: said once
    [message] = _dropped(caplog)
    assert message.startswith(DROPPED + "2 schedules end with it: "), message
    assert _named(message) == ["also", "hourly"], message
    assert "run_forever()" in message and 'store="jobs.db"' in message, message


def test_an_exception_that_leaves_the_block_names_them_too(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ValueError, match="boom"), make_scheduler(workers=1) as s:
        s.every(60, jobs.noop, id="hourly")
        raise ValueError("boom")
    [message] = _dropped(caplog)
    assert message.startswith(DROPPED + "1 schedule ends with it: hourly. "), message


def test_with_a_store_the_schedules_stay_and_nothing_is_said(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with make_scheduler(workers=1, store=tmp_path / "jobs.db") as s:
        s.every(60, jobs.noop, id="hourly")
    assert not _dropped(caplog)


def test_a_schedule_cancelled_before_the_end_is_not_said(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    with make_scheduler(workers=1) as s:
        s.every(60, jobs.noop, id="hourly").cancel()
    assert not _dropped(caplog)


def test_a_connect_client_that_ends_says_nothing_its_schedules_live_on(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    s = make_scheduler(workers=1)
    with mpsched.connect(s.address, authkey=s.authkey) as client:
        client.every(60, jobs.noop, id="theirs")
    assert not _dropped(caplog)
    assert [schedule.id for schedule in s.schedules()] == ["theirs"]
    s.shutdown()  # its manager holds them: the Scheduler's end drops them, and says so
    [message] = _dropped(caplog)
    assert message.startswith(DROPPED + "1 schedule ends with it: theirs. "), message


def test_a_program_that_ends_without_shutdown_names_them_at_exit(programs: Programs) -> None:
    done = programs.run(
        str(
            programs.script(
                PREAMBLE
                + textwrap.dedent("""
        s = Scheduler(workers=1)
        s.every(60, jobs.noop, id="hourly")
    """),
                "ends.py",
            )
        ),
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(DROPPED + "1 schedule ends with it: hourly. "), done.stderr
