"""A job id a program can read is known to the manager: another process may look it up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import jobs
import pytest

import mpsched
from mpsched import Client, Scheduler
from mpsched._cli.jobs import NOT_FINISHED
from mpsched._cli.main import main
from mpsched._errors import InvalidJobError, JobNotFoundError, ScheduleNotFoundError
from mpsched._protocol.records import Exit

pytestmark = pytest.mark.slow

# Connects, says so, then looks up each id it reads on stdin and prints what it found.
LOOKER = """
import sys
import mpsched
client = mpsched.connect(sys.argv[1], authkey=bytes.fromhex(sys.argv[2]))
print("ready", flush=True)
for line in sys.stdin:
    try:
        print("found", client.job(line.strip()).job_id, flush=True)
    except Exception as exc:
        print("missing", type(exc).__name__, flush=True)
client.detach()
"""


@pytest.fixture
def looker(
    make_scheduler: Callable[..., Scheduler],
) -> Iterator[tuple[Scheduler, subprocess.Popen[str]]]:
    s = make_scheduler(workers=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOKER, s.address, s.authkey.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield s, proc
    finally:
        proc.kill()
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_an_id_read_right_after_schedule_is_found_by_another_process(
    looker: tuple[Scheduler, subprocess.Popen[str]],
) -> None:
    s, proc = looker
    assert proc.stdin is not None and proc.stdout is not None
    # A backlog of write-behind submits ahead of it: its submit has not left this process
    # when its id is read.
    for _ in range(20_000):
        s.schedule(jobs.noop, delay=3600)
    future = s.schedule(jobs.noop, delay=3600)
    proc.stdin.write(future.job_id + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == f"found {future.job_id}\n"


def test_job_info_looks_one_job_up_by_id(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(workers=1)
    later = s.schedule(jobs.noop, delay=3600, key="k")
    info = s.job_info(later.job_id)
    assert (info.job_id, info.state, info.name, info.key) == (
        later.job_id,
        "pending",
        "jobs:noop",
        "k",
    )
    with pytest.raises(JobNotFoundError):
        s.job_info("no-such-job")
    with pytest.raises(InvalidJobError):
        s.job_info("")


def test_get_schedule_finds_a_schedule_by_id(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(workers=1)
    added = s.every(3600, jobs.noop, id="hourly")
    assert s.get_schedule("hourly") == added
    with pytest.raises(ScheduleNotFoundError):
        s.get_schedule("no-such-schedule")


def _no_listing(*args: object) -> None:
    raise AssertionError("looked the id up through a listing")


def test_result_and_cancel_look_an_id_up_without_listing(
    make_scheduler: Callable[..., Scheduler],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = make_scheduler(workers=1)
    later = s.schedule(jobs.noop, delay=3600)
    s.every(3600, jobs.noop, id="hourly")
    key = tmp_path / "key"
    key.write_bytes(s.authkey)
    key.chmod(0o600)
    flags = ["--connect", f"unix:{s.address}", "--authkey-file", str(key)]
    monkeypatch.setattr(Client, "jobs", _no_listing)
    monkeypatch.setattr(Client, "schedules", _no_listing)
    assert main(["result", later.job_id, *flags]) == NOT_FINISHED
    assert "it is pending" in capsys.readouterr().err
    assert main(["cancel", "hourly", *flags]) == Exit.OK
    assert main(["cancel", later.job_id, *flags]) == Exit.OK
    assert main(["cancel", later.job_id, *flags]) == Exit.FAILURE
    assert f"job {later.job_id} was not cancelled" in capsys.readouterr().err


def test_without_a_store_ended_jobs_keep_their_ids(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = make_scheduler(workers=1)  # no store
    done = s.submit(jobs.noop, "it ran")
    assert done.result(30) == "it ran"
    later = s.schedule(jobs.noop, delay=3600)
    assert later.job_id and later.cancel()  # the id read: the manager has the job
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        assert other.job(done.job_id).result(30) == "it ran"  # another client, after its end
        assert other.job(later.job_id).cancelled()
        states = {info.job_id: info.state for info in other.jobs()}
        assert states[done.job_id] == "done" and states[later.job_id] == "cancelled"
    finally:
        other.detach()
    key = tmp_path / "key"
    key.write_bytes(s.authkey)
    key.chmod(0o600)
    flags = ["--connect", f"unix:{s.address}", "--authkey-file", str(key)]
    assert main(["result", done.job_id, *flags]) == Exit.OK
    assert capsys.readouterr().out == '"it ran"\n'
    assert main(["result", later.job_id, *flags]) == Exit.FAILURE
    assert "it was cancelled" in capsys.readouterr().err
