"""Ctrl-C stops a program, or says what it waits for; a second one stops it now.

Each program is a real script in its own session. Ctrl-C is SIGINT to its whole process
group, as a terminal sends it (the manager and the workers get it too, and ignore it),
once a fifo shows that the job the program waits for has started.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import psutil
import pytest
from processes import Lines, Programs, assert_gone, wait_started

import mpsched
from mpsched import Scheduler

pytestmark = pytest.mark.slow

EXIT_TIMEOUT = 60.0  # a program that must end now: stopping a manager, on 2 busy cores

# A shell that runs the tests in the background may start them with SIGINT ignored, which
# the programs would inherit; a program under a terminal gets KeyboardInterrupt.
PREAMBLE = """\
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import jobs, mpsched
from mpsched import Scheduler
"""

WAITING = re.compile(
    r"waiting for 1 running job: jobs:announce_then_(wait|sleep) \(\w+-\d+\); "
    r"press Ctrl-C again to stop it now$"
)


class Program:
    """A started program: its output lines, and every process it started."""

    def __init__(self, programs: Programs, source: str, fifo: str) -> None:
        self.popen = programs.start(str(programs.script(PREAMBLE + textwrap.dedent(source))))
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self.out, self.err = Lines(self.popen.stdout), Lines(self.popen.stderr)
        threading.Thread(target=self._unblock, args=(fifo,), daemon=True).start()
        self.job_pids = wait_started(fifo)
        assert self.job_pids, f"the program ended first: {self.err.rest()}"
        self.out.until(lambda line: line.startswith("submitted"))
        # The manager, its forkserver and workers: none may outlive the program.
        self.family: list[psutil.Process] = programs.note_descendants(self.popen)
        assert len(self.family) >= 2, self.family

    def _unblock(self, fifo: str) -> None:
        """If the program ends before its job announced itself, end the wait for it."""
        self.popen.wait()
        with contextlib.suppress(OSError):  # ENXIO: nobody waits on the fifo any more
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    def interrupt(self) -> None:
        os.killpg(self.popen.pid, signal.SIGINT)

    def wait(self) -> int:
        try:
            return self.popen.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running after {EXIT_TIMEOUT} s; stderr: {self.err.seen}"
            ) from None

    def assert_nothing_left(self) -> None:
        assert_gone([*self.family, *self.job_pids])


@pytest.fixture
def release(tmp_path: Path) -> Callable[[], None]:
    """Lets a running jobs.announce_then_wait end."""
    return (tmp_path / "release").touch


def _mpsched_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("mpsched:")]


def test_ctrl_c_in_a_with_block_cancels_what_has_not_started_and_waits_for_what_runs(
    programs: Programs, fifo: str, tmp_path: Path, release: Callable[[], None]
) -> None:
    program = Program(
        programs,
        f"""
        with Scheduler(workers=1) as s:
            f = s.submit(jobs.announce_then_wait, {fifo!r}, {str(tmp_path / "release")!r}, 120)
            s.schedule(jobs.noop, 1, delay=600)
            print("submitted", flush=True)
            f.result()
    """,
        fifo,
    )
    program.interrupt()
    line = program.err.next()
    assert line.startswith(
        "mpsched: KeyboardInterrupt left the with block: cancelled 1 job not started; "
    ), line
    assert WAITING.search(line), line
    assert program.popen.poll() is None  # it waits for the running job...
    release()
    assert program.wait() == -signal.SIGINT  # ...then the KeyboardInterrupt goes on
    rest = program.err.rest()
    assert rest[-1] == "KeyboardInterrupt", rest
    assert not _mpsched_lines(rest), rest
    program.assert_nothing_left()


def test_a_second_ctrl_c_stops_the_running_jobs_and_exits_130(
    programs: Programs, fifo: str
) -> None:
    program = Program(
        programs,
        f"""
        with Scheduler(workers=2) as s:
            f = s.submit(jobs.announce_then_sleep, {fifo!r}, 300, child=True)
            s.schedule(jobs.noop, 1, delay=600)
            print("submitted", flush=True)
            f.result()
    """,
        fifo,
    )
    assert len(program.job_pids) == 2  # the worker and the job's own child
    program.interrupt()
    assert WAITING.search(program.err.next())
    program.interrupt()
    assert program.wait() == 130
    rest = program.err.rest()
    assert len(rest) == 1, rest
    [line] = rest
    assert re.fullmatch(
        r"mpsched: Ctrl-C again: stopped the manager and its workers, "
        r"killing 1 running job: jobs:announce_then_sleep \(\w+-\d+\)",
        line,
    )
    program.assert_nothing_left()


def test_with_a_store_ctrl_c_leaves_the_jobs_due_later_in_it(
    programs: Programs,
    fifo: str,
    tmp_path: Path,
    release: Callable[[], None],
    make_scheduler: Callable[..., Scheduler],
) -> None:
    store = tmp_path / "jobs.db"
    program = Program(
        programs,
        f"""
        with Scheduler(workers=1, store={str(store)!r}) as s:
            f = s.submit(jobs.announce_then_wait, {fifo!r}, {str(tmp_path / "release")!r}, 120)
            due = s.submit(jobs.noop, 1)  # due, but the one worker is busy
            later = s.schedule(jobs.noop, 2, delay=600)
            print("submitted", due.job_id, later.job_id, flush=True)
            f.result()
    """,
        fifo,
    )
    _, due_id, later_id = program.out.seen[-1].split()
    program.interrupt()
    line = program.err.next()
    assert line.startswith(
        f"mpsched: KeyboardInterrupt left the with block: cancelled 1 job "
        f"not started; 1 job due later stays pending in the store {store}; "
    ), line
    assert WAITING.search(line), line
    release()
    assert program.wait() == -signal.SIGINT
    program.assert_nothing_left()
    after = make_scheduler(workers=1, store=store)
    assert [j.job_id for j in after.jobs(state="pending")] == [later_id]
    assert [j.job_id for j in after.jobs(state="cancelled")] == [due_id]


def test_ctrl_c_while_the_with_block_waits_for_a_job_due_later_ends_it(
    programs: Programs, fifo: str
) -> None:
    # Leaving the block waits for every job, one due in 10 minutes included.
    program = Program(
        programs,
        f"""
        with Scheduler(workers=1) as s:
            s.submit(jobs.announce, {fifo!r}).result()
            s.schedule(jobs.noop, 1, delay=600)
            print("submitted", flush=True)
    """,
        fifo,
    )
    program.interrupt()
    assert program.wait() == -signal.SIGINT
    lines = program.err.rest()
    assert _mpsched_lines(lines) == [
        "mpsched: KeyboardInterrupt left the with block: cancelled 1 job not started"
    ], lines
    program.assert_nothing_left()


def test_a_program_that_ends_on_ctrl_c_without_with_says_what_it_waits_for(
    programs: Programs, fifo: str, tmp_path: Path
) -> None:
    program = Program(
        programs,
        f"""
        s = Scheduler(workers=1)
        f = s.submit(jobs.announce_then_wait, {fifo!r}, {str(tmp_path / "release")!r}, 120)
        s.schedule(jobs.noop, 1, delay=600)
        print("submitted", flush=True)
        f.result()
    """,
        fifo,
    )
    program.interrupt()
    line = program.err.until(lambda line: line.startswith("mpsched:"))
    assert program.err.seen[-2] == "KeyboardInterrupt", program.err.seen  # its traceback
    assert line.startswith(
        "mpsched: KeyboardInterrupt ended the program: cancelled 1 job not started; "
    ), line
    assert WAITING.search(line), line
    program.interrupt()
    assert program.wait() == -signal.SIGINT  # the status of the KeyboardInterrupt it ended on
    rest = program.err.rest()
    assert len(rest) == 1, rest
    [stopped] = rest
    assert stopped.startswith(
        "mpsched: Ctrl-C again: stopped the manager and its workers, "
        "killing 1 running job: jobs:announce_then_wait"
    ), stopped
    program.assert_nothing_left()


def test_a_connected_client_stops_waiting_and_its_jobs_run_on(
    programs: Programs, fifo: str, tmp_path: Path
) -> None:
    done = tmp_path / "done.log"
    program = Program(
        programs,
        f"""
        s = Scheduler(workers=1)
        with mpsched.connect(s.address, authkey=s.authkey) as c:
            f = c.submit(jobs.record_then_sleep, {str(done)!r}, "ran", {fifo!r}, 3)
            print("submitted", flush=True)
            f.result()
    """,
        fifo,
    )
    program.interrupt()
    line = program.err.next()
    assert line.startswith(
        "mpsched: KeyboardInterrupt left the with block: waiting for 1 "
        "running job: jobs:record_then_sleep"
    ), line
    program.interrupt()
    # The client stops waiting; the Scheduler's exit lets the job end (it is not its own).
    assert program.wait() == 130
    rest = program.err.rest()
    assert len(rest) == 1, rest
    [line] = rest
    assert line.startswith(
        "mpsched: Ctrl-C again: stopped waiting; 1 running job runs on in "
        "the manager: jobs:record_then_sleep"
    ), line
    assert done.read_text().split() == ["ran"]
    program.assert_nothing_left()


def test_an_exception_that_leaves_the_with_block_cancels_jobs_not_started(
    make_scheduler: Callable[..., Scheduler], fifo: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = make_scheduler(workers=1)
    with pytest.raises(ValueError, match="boom"), s:
        running = s.submit(jobs.announce_then_sleep, fifo, 0.5)
        wait_started(fifo)
        later = s.schedule(jobs.noop, 1, delay=600)
        raise ValueError("boom")
    assert running.result(timeout=0) == "woke"  # waited for
    assert later.cancelled()
    [message] = [r.getMessage() for r in caplog.records if r.name == "mpsched.client"]
    assert message.startswith(
        "mpsched: ValueError left the with block: cancelled 1 job not "
        "started; waiting for 1 running job: jobs:announce_then_sleep"
    ), message
    assert message.endswith("; press Ctrl-C to stop it now"), message


def test_an_exception_that_leaves_a_clients_with_block_cancels_its_jobs(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    s = make_scheduler(workers=1)
    client = mpsched.connect(s.address, authkey=s.authkey)
    pending: list[Any] = []
    with pytest.raises(KeyError), client:
        pending.append(client.schedule(jobs.noop, 1, delay=600))
        raise KeyError("x")
    assert pending[0].cancelled()
    assert s.jobs(state="pending") == []
    assert [r.getMessage() for r in caplog.records if r.name == "mpsched.client"] == [
        "mpsched: KeyError left the with block: cancelled 1 job not started"
    ]


def test_a_ctrl_c_while_the_exit_waits_for_running_jobs_says_what_it_waits_for(
    make_scheduler: Callable[..., Scheduler],
    fifo: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The program ended normally; the interpreter's exit waits for what is due, and the
    # Ctrl-C comes then (a real one could also land before the exit hooks run).
    s = make_scheduler(workers=1)
    running = s.submit(jobs.announce_then_sleep, fifo, 0.5)
    wait_started(fifo)

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(s._closing, "exit_work", interrupted)
    s._closing.at_exit()
    assert running.result(timeout=0) == "woke"
    [message] = [r.getMessage() for r in caplog.records if r.name == "mpsched.client"]
    assert message.startswith(
        "mpsched: KeyboardInterrupt while the program exits: waiting "
        "for 1 running job: jobs:announce_then_sleep"
    ), message
    assert WAITING.search(message), message


def test_a_call_that_ctrl_c_cut_short_leaves_no_reply_for_the_next_one(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(workers=1)
    later = s.schedule(jobs.noop, 1, delay=600)
    s.stats()  # this thread's connection exists
    proxy: Any = s._core.service
    # What a Ctrl-C in the middle of a call leaves (a submit waiting for room, say): the
    # request went out, its reply will come unread.
    proxy._tls.connection.send((proxy._id, "stats", (), {}))
    with pytest.raises(KeyboardInterrupt), s:
        raise KeyboardInterrupt
    assert later.cancelled()


def test_in_an_interactive_session_a_second_ctrl_c_goes_back_to_the_prompt(
    programs: Programs, fifo: str
) -> None:
    popen, terminal = programs.interactive()
    terminal.type(
        PREAMBLE
        + textwrap.dedent(f"""\
        with Scheduler(workers=1) as s:
            f = s.submit(jobs.announce_then_sleep, {fifo!r}, 300)
            print("submit" + "ted", flush=True)
            f.result()

    """)
    )
    job_pids = wait_started(fifo)
    terminal.read_until("\nsubmitted\n")
    family = programs.note_descendants(popen)
    os.killpg(popen.pid, signal.SIGINT)
    terminal.read_until("press Ctrl-C again to stop it now")
    os.killpg(popen.pid, signal.SIGINT)
    terminal.read_until(
        "mpsched: Ctrl-C again: stopped the manager and its workers, "
        "killing 1 running job: jobs:announce_then_sleep"
    )
    terminal.read_until("KeyboardInterrupt\n>>> ")
    assert_gone([*family, *job_pids])
    terminal.type('print("still" + " here")\n')
    terminal.read_until("\nstill here\n")
    terminal.type("exit()\n")
    terminal.read_to_end(EXIT_TIMEOUT)
    assert popen.wait(EXIT_TIMEOUT) == 0
