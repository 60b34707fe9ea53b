"""Recurring jobs from the command line: submit --every/--cron, schedules, cancel ID, and a
schedule that outlives a killed ``serve --store``. Real serve processes (``procs``)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jobs
import pytest
from processes import wait_for
from served import Manager, Processes, serve

from mpsched import Client, Scheduler
from mpsched._cli.main import main
from mpsched._cli.parser import build_parser
from mpsched._cli.schedules import check_recurring
from mpsched._client.recurring import ScheduleRequest, build_spec
from mpsched._core.recurring import ScheduleKind
from mpsched._errors import InvalidJobError
from mpsched._protocol.records import Exit

pytestmark = pytest.mark.slow


def runner(procs: Processes, manager: Manager):
    def run(*argv: str) -> tuple[int, str, str]:
        done = procs.run(*argv, *manager.cli())
        return done.returncode, done.stdout, done.stderr

    return run


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_submit_every_lists_and_cancels_a_schedule(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    run = runner(procs, serve(procs, "--workers", "1"))
    code, out, err = run(
        "submit",
        "jobs:record",
        "--args",
        json.dumps([str(log), "tick"]),
        "--every",
        "0.2",
        "--delay",
        "0",
        "--id",
        "tick",
    )
    assert code == Exit.OK, err
    assert out.splitlines()[0] == "tick" and "every 0.2s (rate), next run" in out
    wait_for(lambda: len(lines(log)) >= 3, what="3 runs")
    code, out, err = run("schedules", "--json")
    [listed] = json.loads(out)
    assert (
        listed["id"] == "tick"
        and listed["runs"] >= 3
        and listed["spec"] == "every 0.2s (rate)"
        and listed["last_run"].startswith("tick@")
    )
    code, out, err = run("schedules")
    assert out.splitlines()[0].split() == [
        "id",
        "spec",
        "next",
        "run",
        "runs",
        "skipped",
        "missed",
        "failed",
    ]
    code, out, err = run("cancel", "tick")
    assert code == Exit.OK and "cancelled schedule tick" in out, err
    code, out, err = run("schedules")
    assert out == "no schedules\n"
    code, out, err = run("cancel", "tick")  # neither a schedule nor a job any more
    assert code == Exit.FAILURE and "no such schedule, and no such job" in err, err


def test_submit_cron_checks_the_expression_and_the_zone(procs: Processes) -> None:
    run = runner(procs, serve(procs, "--workers", "1"))
    code, out, err = run(
        "submit", "jobs:noop", "--cron", "30 2 * * 1-5", "--tz", "Europe/Berlin", "--id", "nightly"
    )
    assert code == Exit.OK, err
    assert out.splitlines() == ["nightly", out.splitlines()[1]]
    assert "cron '30 2 * * 1-5' (Europe/Berlin)" in out and "02:30" not in err
    code, out, err = run("submit", "jobs:noop", "--cron", "61 * * * *")
    assert code == Exit.USAGE and "cron expression" in err, err
    code, out, err = run("submit", "jobs:noop", "--cron", "0 2 * * *", "--tz", "Nowhere/X")
    assert code == Exit.USAGE and "time zone" in err, err


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--id", "x"], "--id needs --every or --cron"),
        (["--overlap", "allow"], "--overlap needs --every or --cron"),
        (["--every", "5", "--wait"], "--wait cannot wait for a schedule"),
        (["--cron", "* * * * *", "--delay", "3"], "--delay and --at set the first run"),
        (["--every", "5", "--tz", "UTC"], "--tz is for --cron"),
        (["--mode", "delay"], "--mode needs --every"),
        (["--on-error", "pause"], "--on-error needs --every or --cron"),
        (["--every", "5", "--key", "k"], "--key is for a single job"),
        (["--cron", "* * * * *", "--mode", "delay"], "--mode is for --every"),
    ],
    ids=[
        "id",
        "overlap",
        "wait",
        "cron-delay",
        "every-tz",
        "mode",
        "on-error",
        "every-key",
        "cron-mode",
    ],
)
def test_recurring_options_that_do_not_fit_are_usage_errors(argv: list[str], problem: str) -> None:
    args = build_parser().parse_args(["submit", "jobs:noop", "--connect", "unix:/x", *argv])
    assert (check_recurring(args) or "").startswith(problem)


def test_a_schedule_outlives_a_killed_serve_and_catches_up_once(
    procs: Processes, tmp_path: Path
) -> None:
    store, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    first = serve(procs, "--workers", "1", "--store", str(store), "--durability", "process")
    code, out, err = runner(procs, first)(
        "submit",
        "jobs:record",
        "--args",
        json.dumps([str(log), "tick"]),
        "--every",
        "0.25",
        "--delay",
        "0",
        "--id",
        "tick",
    )
    assert code == Exit.OK, err
    wait_for(lambda: len(lines(log)) >= 2, what="2 runs")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    before = len(lines(log))
    time.sleep(1.5)  # the downtime itself: six slots pass with no manager
    again = serve(
        procs,
        "--workers",
        "1",
        "--store",
        str(store),
        "--durability",
        "process",
        "--address",
        first.address,
        "--authkey-file",
        str(first.key_file),
    )
    run = runner(procs, again)
    wait_for(lambda: len(lines(log)) >= before + 2, what="runs after the restart")
    code, out, err = run("schedules", "--json")
    [listed] = json.loads(out)
    # One run stood for the slots missed while down (catchup="latest"); they are counted.
    assert listed["id"] == "tick" and listed["runs"] >= 2 and listed["missed"] >= 4, listed
    code, out, err = run("cancel", "tick")
    assert code == Exit.OK, err
    code, out, err = run("jobs", "--json")
    runs = [job for job in json.loads(out) if job["job_id"].startswith("tick@")]
    assert len({job["job_id"] for job in runs}) == len(runs)
    done = sum(job["state"] == "done" for job in runs)
    crashed = sum(job["state"] == "failed" for job in runs)
    assert done <= len(lines(log)) <= done + crashed  # each slot ran at most once


MISSED = re.compile(r"schedule tick: (\d+) slot\(s\) missed \(the manager was down")


def test_after_each_restart_the_missed_warning_counts_that_outage_alone(
    procs: Processes, tmp_path: Path
) -> None:
    store, log = tmp_path / "jobs.db", tmp_path / "runs.log"
    options = ["--workers", "1", "--store", str(store), "--durability", "process"]
    manager = serve(procs, *options)
    again = [*options, "--address", manager.address, "--authkey-file", str(manager.key_file)]
    code, out, err = runner(procs, manager)(
        "submit",
        "jobs:record",
        "--args",
        json.dumps([str(log), "tick"]),
        "--every",
        "1",
        "--delay",
        "0",
        "--id",
        "tick",
    )
    assert code == Exit.OK, err
    wait_for(lambda: len(lines(log)) >= 1, what="the first run")
    warned, missed = [], [0]
    for downtime in (3.5, 2.5):
        os.kill(manager.proc.pid, signal.SIGKILL)
        manager.proc.wait()
        before = len(lines(log))
        time.sleep(downtime)  # slots pass with no manager
        manager = serve(procs, *again)
        wait_for(lambda: len(lines(log)) > before, what="the catch-up run")  # noqa: B023
        code, out, err = runner(procs, manager)("schedules", "--json")
        [listed] = json.loads(out)
        missed.append(listed["missed"])
        wait_for(
            lambda: MISSED.search(manager.proc.stderr()),  # noqa: B023
            30,
            what="the missed slots warned of",
        )
        warned.append(int(MISSED.findall(manager.proc.stderr())[-1]))
    outages = [later - earlier for earlier, later in itertools.pairwise(missed)]
    assert all(outages) and warned == outages, (warned, missed)


def test_cancel_says_so_when_another_client_cancelled_the_schedule_first(
    make_scheduler: Callable[..., Scheduler],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = make_scheduler(workers=1)
    found = s.every(3600, jobs.noop, id="x")
    found.cancel()  # another client's cancel, between this one's lookup and cancel
    monkeypatch.setattr(Client, "get_schedule", lambda self, schedule_id: found)
    key = tmp_path / "key"
    key.write_bytes(s.authkey)
    key.chmod(0o600)
    code = main(["cancel", "x", "--connect", f"unix:{s.address}", "--authkey-file", str(key)])
    assert code == Exit.FAILURE
    assert (
        capsys.readouterr().err
        == "mpsched: schedule x was not cancelled: it was cancelled already\n"
    )


def test_schedules_json_names_the_armed_run_apart_from_the_last_one_that_ran(
    procs: Processes,
) -> None:
    run = runner(procs, serve(procs, "--workers", "1"))
    code, out, err = run(
        "submit", "jobs:noop", "--every", "3600", "--delay", "3600", "--id", "later"
    )
    assert code == Exit.OK, err
    code, out, err = run("schedules", "--json")
    [listed] = json.loads(out)
    next_run = datetime.fromisoformat(listed["next_run"])
    assert next_run.utcoffset() == timedelta(0)
    assert abs(next_run - datetime.now(timezone.utc) - timedelta(hours=1)) < timedelta(minutes=5)
    assert listed["next_run_id"].startswith("later@") and listed["last_run"] is None, listed


def test_submit_every_takes_mode_and_on_error(procs: Processes) -> None:
    run = runner(procs, serve(procs, "--workers", "1"))
    code, out, err = run(
        "submit",
        "jobs:fail",
        "--args",
        '["boom"]',
        "--every",
        "0.2",
        "--delay",
        "0",
        "--mode",
        "delay",
        "--on-error",
        "pause",
        "--id",
        "d",
    )
    assert code == Exit.OK, err
    assert "every 0.2s (delay), next run" in out

    def listed() -> dict[str, object]:
        [schedule] = json.loads(run("schedules", "--json")[1])
        return schedule

    wait_for(lambda: listed()["paused"], what="the schedule to pause after its failed run")
    assert listed()["failed"] == 1 and listed()["spec"] == "every 0.2s (delay)"


@pytest.mark.parametrize("value", ["0", "-1", "0.0001", "inf", "1e300"])
def test_every_is_held_to_one_rule_in_one_wording_by_the_cli_and_the_library(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["submit", "jobs:noop", "--every", value, "--connect", "unix:/nowhere"])
    assert exited.value.code == Exit.USAGE
    err = capsys.readouterr().err
    with pytest.raises(InvalidJobError) as caught:
        build_spec(
            ScheduleRequest(kind=ScheduleKind.EVERY, interval=float(value)), jobs.noop, (), {}
        )
    library = str(caught.value)
    rule = "less than" if value == "1e300" else "a finite number of seconds >= 0.001, not"
    assert library.startswith(f"interval must be {rule}"), library
    words = library.removeprefix("interval ").replace(f"{float(value):g}", value)
    assert err == f"mpsched: argument --every: {words}; see python -m mpsched submit --help\n"


HIDE_CRONSIM = """
import sys
sys.modules["cronsim"] = None  # import cronsim fails in this manager process
from mpsched._cli.main import main
raise SystemExit(main(["serve", *sys.argv[1:]]))
"""


def test_submit_cron_says_which_side_lacks_cronsim(
    procs: Processes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = serve(procs, "--workers", "0", code=HIDE_CRONSIM)
    code, _, err = runner(procs, manager)("submit", "jobs:noop", "--cron", "0 2 * * *")
    assert code == Exit.USAGE
    pid = manager.proc.pid
    assert err == (
        f"mpsched: cron schedules need the optional dependency cronsim, missing "
        f"in the manager (pid {pid} on {socket.gethostname()}): pip install "
        f"'mpsched[cron]' there\n"
    ), err

    monkeypatch.setitem(sys.modules, "cronsim", None)  # now this client lacks it too
    assert main(["submit", "jobs:noop", "--cron", "0 2 * * *", *manager.cli()]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err == (
        "mpsched: cron schedules need the optional dependency cronsim, missing "
        "in this process (the client): pip install 'mpsched[cron]' there\n"
    ), err
    assert runner(procs, manager)("schedules")[1] == "no schedules\n"
