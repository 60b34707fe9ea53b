"""``serve --store`` end to end, and the commands that read and change jobs: jobs, cancel,
result. Real serve processes on real files; every test stops the processes it starts
(the ``procs`` fixture kills each one's session)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
import textwrap
import time
import traceback
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest
import store_jobs
from processes import wait_for, wait_started
from served import START_TIMEOUT, Manager, Processes, serve

import mpsched
from mpsched import JobInfo, Priority
from mpsched._cli.formats import format_size
from mpsched._cli.jobs import format_jobs
from mpsched._cli.main import main
from mpsched._cli.parser import EXIT_MEANINGS, build_parser
from mpsched._cli.serve import store_path
from mpsched._cli.status import format_stats, format_store
from mpsched._core.job import QueueStats
from mpsched._protocol.records import (
    Exit,
    Stats,
)
from mpsched._store.base import StoredJob
from mpsched._store.sqlite import SQLiteStore
from mpsched._transport.authkey import AUTHKEY_ENV

pytestmark = pytest.mark.slow

# The manager maps wall-clock due times to its monotonic clock with one offset, re-synced
# only past 1 ms of drift: a job's wall-clock start may read up to that much before its
# due time without having started early on the manager's clock.
CLOCK_SLACK = 0.002


def serve_store(procs: Processes, store: Path, *args: str) -> Manager:
    """``serve --store`` on a fresh private socket; checks the banner names the store."""
    manager = serve(procs, "--store", str(store), *args)
    assert manager.proc.line().startswith("  status: ")
    banner = manager.proc.line()
    assert banner.startswith(f"  store:  {os.path.realpath(store)} (durability "), banner
    return manager


def kill(manager: Manager) -> None:
    os.kill(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()


def kill_tree(manager: Manager) -> None:
    """SIGKILL the manager with every process it started (its process group), at once."""
    os.killpg(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()


def reconnected(client: mpsched.Client) -> bool:
    """Whether ``client`` is back with its manager (its calls raise until it is)."""
    try:
        client.stats()
    except mpsched.ManagerConnectionLostError:
        return False
    return True


def idle(manager: Manager) -> bool:
    stats = manager.stats()
    return sum(stats.pending.values()) == 0 and stats.in_flight == 0


# ------------------------------------------------------------------------------ recovery


def test_a_killed_serve_runs_every_job_once_after_a_restart_and_none_early(
    procs: Processes, tmp_path: Path, connect_client: Callable[[Manager], mpsched.Client]
) -> None:
    store, log = tmp_path / "jobs.db", str(tmp_path / "runs.log")
    first = serve_store(procs, store, "--workers", "4")
    client = connect_client(first)
    # Four jobs hold the four workers (their first run sleeps a minute), so none of the
    # jobs below can start before the kill; two may run again, two may not.
    retries = {"hold-retry-1": 1, "hold-retry-2": 1, "hold-once-1": 0, "hold-once-2": 0}
    held = {
        key: client.schedule(store_jobs.hold, log, key, 60.0, 0.2, retries=n).job_id
        for key, n in retries.items()
    }
    wait_for(
        lambda: set(store_jobs.read_log(log)) == set(retries),
        START_TIMEOUT,
        "the four holding jobs started",
    )
    t0 = time.time()
    due = {f"job-{i}": t0 + 1 + 2 * i / 2000 for i in range(2000)}  # due in 1 to 3 s
    for key, at in due.items():
        client.schedule(store_jobs.record_at, log, key, at=at)
    client.stats()  # returns once the manager acknowledged every job above
    kill(first)
    assert set(store_jobs.read_log(log)) == set(retries)  # nothing else ran

    restarted = time.time()
    second = serve_store(procs, store, "--workers", "4")
    assert second.proc.line() == (  # the banner says what came back
        f"  recovered {len(due)} pending job(s) from {os.path.realpath(store)}; of 4 running "
        "when the manager stopped, 2 will run again and 2 failed (WorkerCrashedError)"
    )
    wait_for(
        lambda: len(store_jobs.read_log(log)) == len(due) + len(retries) and idle(second),
        90,
        "every recovered job ran",
    )
    runs = store_jobs.read_log(log)
    assert {key: len(runs[key]) for key in due} == dict.fromkeys(due, 1)
    early = {key: at - runs[key][0] for key, at in due.items() if runs[key][0] < at - CLOCK_SLACK}
    assert not early, f"{len(early)} jobs started early, by up to {max(early.values())} s"
    for key, n in retries.items():
        assert len(runs[key]) == 1 + n, (key, runs[key])
        assert runs[key][0] < restarted  # the first run, before the kill
        if n:
            assert runs[key][1] >= restarted  # the retry, on the restarted manager

    for key, job_id in held.items():
        shown = procs.run("result", job_id, *second.cli())
        if retries[key]:
            assert shown.returncode == Exit.OK, shown.stderr
            assert shown.stdout == f'"{key}"\n'
        else:
            assert shown.returncode == Exit.FAILURE, shown.stderr
            assert f"job {job_id} failed: WorkerCrashedError" in shown.stderr


def test_a_serve_killed_with_its_workers_mid_batch_ends_what_ran_and_requeues_the_rest(
    procs: Processes, tmp_path: Path, fifo: str, connect_client: Callable[[Manager], mpsched.Client]
) -> None:
    # One worker is handed a batch (its last job was short): a, then stop (which SIGSTOPs
    # the manager: a's report, held back while the batch goes on, can no longer reach it),
    # then c, d, e, never started. Then the manager's whole process tree is SIGKILLed, the
    # worker with it. What ran to its end must end done, what never started must run
    # after the restart (none of it is an attempt), and only the job under way is lost.
    store, log = tmp_path / "jobs.db", str(tmp_path / "runs.log")
    manager = serve_store(procs, store, "--workers", "1")
    client = connect_client(manager)
    at = time.time() + 0.5  # due together, after the client sent them all
    warm = client.schedule(store_jobs.bracketed, log, "warm", 0.0, at=at)
    keys = {client.schedule(store_jobs.bracketed, log, "a", 0.0, at=at): "a"}
    stop = client.schedule(
        store_jobs.stop_manager_then_sleep, log, "stop", manager.proc.pid, fifo, at=at
    )
    keys.update({client.schedule(store_jobs.bracketed, log, key, 0.0, at=at): key for key in "cde"})
    wait_started(fifo)
    kill_tree(manager)
    assert "start c" not in Path(log).read_text()

    restarted = serve_store(procs, store, "--workers", "1")
    # a, stop and c, d, e are running or pending, by how many the batch took; of the
    # running ones, a ended, stop failed, the others had not started.
    recovered = re.fullmatch(
        rf"  recovered (\d) pending job\(s\) from {re.escape(os.path.realpath(store))}; of "
        r"(\d) running when the manager stopped, 1 had ended, (?:(\d) had not started, )?"
        r"0 will run again and 1 failed \(WorkerCrashedError\)",
        restarted.proc.line(),
    )
    assert recovered, "the banner says what came back"
    pending, running, unstarted = (int(n or 0) for n in recovered.groups())
    assert pending + running == 5 and unstarted == running - 2
    assert warm.result(timeout=START_TIMEOUT) == "warm"  # reported before the batch
    assert isinstance(stop.exception(timeout=START_TIMEOUT), mpsched.WorkerCrashedError)
    assert {key: future.result(timeout=START_TIMEOUT) for future, key in keys.items()} == {
        key: key for key in "acde"
    }
    lines = Path(log).read_text().splitlines()
    assert Counter(lines) == Counter(
        [f"start {key}" for key in ("warm", "a", "stop", "c", "d", "e")]
        + [f"end {key}" for key in ("warm", "a", "c", "d", "e")]
    )  # each ran once


CLIENT = textwrap.dedent("""
    import random, sys
    import mpsched, jobs

    client = mpsched.connect(sys.argv[1])  # the key comes from MPSCHED_AUTHKEY
    with open(sys.argv[2], "a", buffering=1) as acknowledged:
        while True:
            futures = [client.schedule(jobs.noop, delay=random.uniform(0, 0.5),
                                       retries=random.choice([0, 1])) for _ in range(10)]
            client.stats()  # returns once the manager acknowledged every job above
            acknowledged.write(" ".join(f.job_id for f in futures) + "\\n")
""")


def test_serve_killed_at_random_instants_keeps_every_acknowledged_submit(
    procs: Processes, tmp_path: Path
) -> None:
    store, acked = tmp_path / "jobs.db", tmp_path / "acknowledged.txt"
    acked.touch()
    rng = random.Random(7)
    for _ in range(10):
        manager = serve_store(procs, store, "--workers", "1", "--durability", "process")
        before = acked.stat().st_size
        client = procs.start(
            "-c", CLIENT, manager.address, str(acked), env={AUTHKEY_ENV: manager.key.decode()}
        )
        wait_for(
            lambda: acked.stat().st_size > before,  # noqa: B023
            START_TIMEOUT,
            "the client's first acknowledged batch",
        )
        time.sleep(rng.uniform(0, 0.3))  # a random instant of the submit loop
        kill(manager)
        os.kill(client.pid, signal.SIGKILL)  # it saw the manager go, or is about to
        client.wait()

    acknowledged = set(acked.read_text().split())
    assert len(acknowledged) >= 100
    final = serve_store(procs, store, "--workers", "0")
    listed = procs.run("jobs", "--json", *final.cli())
    assert listed.returncode == Exit.OK, listed.stderr
    states = {job["job_id"]: job["state"] for job in json.loads(listed.stdout)}
    assert acknowledged <= set(states), f"lost: {sorted(acknowledged - set(states))[:10]}"
    assert set(states.values()) <= {"pending", "done", "failed"}  # none left running


# ------------------------------------------------------------------------------ refusals


def test_a_second_serve_on_a_store_exits_7_and_the_first_keeps_serving(
    procs: Processes, tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    first = serve_store(procs, store, "--workers", "0")
    runtime_files = set(procs.runtime_dir.rglob("*"))
    # Another socket: a second serve on the default one would find the first one there.
    second = procs.run(
        "serve",
        "--address",
        f"unix:{procs.runtime_dir}/second.sock",
        "--workers",
        "0",
        env={"MPSCHED_STORE": str(store)},
    )
    assert second.returncode == int(Exit.STORE) == 7, second.stderr
    assert second.stderr.count("\n") == 1, second.stderr
    assert str(store) in second.stderr and f"pid {first.proc.pid}" in second.stderr
    assert set(procs.runtime_dir.rglob("*")) == runtime_files  # it left no socket or key

    status = procs.run("status", *first.cli())
    assert status.returncode == Exit.OK, status.stderr
    assert re.search(
        rf"^store     {re.escape(str(store))}, \d+\.\d KiB$", status.stdout, re.MULTILINE
    ), status.stdout
    shown = json.loads(procs.run("status", "--json", *first.cli()).stdout)
    assert shown["store"] == str(store) and shown["store_size"] > 0


def scribbled_store(path: Path) -> None:
    """A real store whose pages after the header are noise."""
    with SQLiteStore(path) as made:
        made.submit(
            [
                StoredJob(
                    f"job-{n}",
                    "client",
                    None,
                    "jobs:noop",
                    b"payload",
                    2,
                    time.time(),
                    n,
                    None,
                    0,
                    0,
                    time.time(),
                )
                for n in range(2000)
            ]
        )
    with path.open("r+b") as file:
        file.seek(4096)
        file.write(os.urandom(path.stat().st_size - 8192))


def foreign_database(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text)")
    conn.close()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(
            lambda p: p.write_bytes(os.urandom(10000)), "not an mpsched store", id="noise"
        ),
        pytest.param(foreign_database, "another program", id="foreign-sqlite"),
        pytest.param(scribbled_store, "", id="corrupt-store"),
    ],
)
def test_a_file_that_is_no_store_exits_7_and_is_left_untouched(
    procs: Processes, tmp_path: Path, make: Callable[[Path], None], reason: str
) -> None:
    store = tmp_path / "jobs.db"
    make(store)
    before = store.read_bytes()
    refused = procs.run("serve", "--store", str(store), "--workers", "0")
    assert refused.returncode == Exit.STORE, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"mpsched: job store {store}: ") and reason in refused.stderr
    assert store.read_bytes() == before
    wal = tmp_path / "jobs.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # nor a change waiting beside it


def test_a_store_in_a_missing_directory_exits_7(procs: Processes, tmp_path: Path) -> None:
    store = tmp_path / "missing" / "jobs.db"
    refused = procs.run("serve", "--store", str(store), "--workers", "0")
    assert refused.returncode == Exit.STORE, refused.stderr
    assert refused.stderr == (
        f"mpsched: job store {store}: its directory {store.parent} does not exist\n"
    )
    assert not store.parent.exists()


def test_a_store_in_a_read_only_directory_exits_7() -> None:
    # Under /tmp, not tmp_path: an unprivileged child must be able to reach it.
    directory = Path(tempfile.mkdtemp(prefix="mpsched-ro-"))
    store = directory / "jobs.db"
    store.write_bytes(b"")
    directory.chmod(0o555)
    try:
        code, err = serve_unprivileged(
            ["serve", "--store", str(store), "--address", "127.0.0.1:0", "--workers", "0"]
        )
        assert sorted(p.name for p in directory.iterdir()) == ["jobs.db"]
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)
    assert code == Exit.STORE, err
    assert err.count("\n") == 1 and err.startswith(f"mpsched: job store {store}: "), err
    assert "not writable" in err


def serve_unprivileged(argv: list[str]) -> tuple[int, str]:
    """Run ``main(argv)`` in a forked child as a user the file modes apply to (root ignores
    them: as root the child drops to nobody); its exit code and stderr."""
    build_parser()  # imports what --version needs: nobody cannot read this Python's files
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on, only os._exit
        code = 99
        try:
            os.close(read)
            sys.stderr = open(write, "w")  # noqa: SIM115 - os._exit() below: flushed there
            os.environ[AUTHKEY_ENV] = "a key for a test"
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            code = main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


# ---------------------------------------------------------------------------- jobs, cancel, result


def test_jobs_cancel_and_result_round_trip_and_outlive_a_restart(
    procs: Processes, tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    manager = serve_store(procs, store, "--workers", "1")

    def run(*argv: str, on: Manager = manager) -> tuple[int, str, str]:
        done = procs.run(*argv, *on.cli())
        return done.returncode, done.stdout, done.stderr

    code, out, err = run("submit", "math:factorial", "--args", "[20]", "--wait")
    assert code == Exit.OK, err
    done_id = out.split()[0]
    code, out, err = run("submit", "math:sqrt", "--args", "[-1]", "--wait")
    failed_id = out.split()[0]
    code, out, err = run("submit", "jobs:noop", "--delay", "3600", "--priority", "high")
    later_id = out.strip()
    # due in 20 s: still pending at the listings below even when each command takes seconds
    # on a loaded machine, and run after the restart at the end
    code, out, err = run("submit", "jobs:noop", "--args", '["after"]', "--delay", "20")
    soon_id = out.strip()

    code, out, err = run("jobs", "--json")
    assert code == Exit.OK, err
    listed = {job["job_id"]: job for job in json.loads(out)}
    assert {job_id: job["state"] for job_id, job in listed.items()} == {
        done_id: "done",
        failed_id: "failed",
        later_id: "pending",
        soon_id: "pending",
    }
    later = listed[later_id]
    assert "noop" in later["name"], later
    assert later["priority"] == "high" and later["attempts"] == 0 and later["worker"] is None
    assert 3500 < later["due_in"] <= 3600
    assert datetime.fromisoformat(later["due"]).utcoffset() == timezone.utc.utcoffset(None)
    assert listed[done_id]["attempts"] == 1 and listed[done_id]["worker"]

    code, out, err = run("jobs", "--state", "pending")
    assert code == Exit.OK, err
    header, *rows = out.splitlines()
    assert header.split() == [
        "id",
        "name",
        "state",
        "due",
        "priority",
        "attempts",
        "worker",
        "progress",
        "last",
        "error",
    ]
    [row] = [r for r in rows if r.startswith(later_id)]
    assert re.search(
        r" pending +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d "
        r"\(in 59 min \d\d s\) +high +0 +- +- +-$",
        row,
    ), row
    assert len(rows) == 2 and all(done_id not in r for r in rows)
    assert listed[failed_id]["error"] == "ValueError: math domain error"
    assert listed[done_id]["error"] is None and listed[done_id]["progress"] is None
    code, out, err = run("jobs", "--state", "failed")  # the failed list, with each error
    assert code == Exit.OK, err
    header, row = out.splitlines()
    assert row.startswith(failed_id) and row.endswith(" ValueError: math domain error"), row

    code, out, err = run("jobs", "--limit", "3", "--json")  # the first three submitted
    assert code == Exit.OK, err
    assert [job["job_id"] for job in json.loads(out)] == [done_id, failed_id, later_id]
    code, out, err = run("jobs", "--state", "pending", "--limit", "1")
    assert code == Exit.OK, err
    assert [row.split()[0] for row in out.splitlines()[1:]] == [later_id]
    code, out, err = run("jobs", "--limit", "0")
    assert code == 2 and "--limit: must be 1 or more, not 0" in err, err

    assert run("result", done_id) == (Exit.OK, "2432902008176640000\n", "")
    code, out, err = run("result", done_id, "--json")
    assert json.loads(out) == {"job_id": done_id, "state": "done", "result": 2432902008176640000}
    code, out, err = run("result", failed_id)
    assert code == Exit.FAILURE and out == ""
    assert err.startswith(
        f"job {failed_id} failed: ValueError: math domain error\n"
        f"the worker's traceback:\nTraceback (most recent call last):\n"
    )
    assert err.endswith("\nValueError: math domain error\n"), err  # kept by the store too
    code, out, err = run("result", later_id, "--json")
    assert code == int(Exit.JOB_TIMEOUT) == 124
    assert json.loads(out) == {"job_id": later_id, "state": "pending"}
    assert "no result yet; --wait waits for it" in err

    assert run("cancel", later_id)[:2] == (Exit.OK, f"cancelled job {later_id}\n")
    for job_id, why in [
        (later_id, "it was cancelled already"),
        (done_id, "it is done"),
        (failed_id, "it failed"),
        ("nosuchjob-1", "no such job"),
    ]:
        code, out, err = run("cancel", job_id)
        assert code == Exit.FAILURE and out == "", (job_id, err)
        assert err.startswith(f"mpsched: job {job_id} was not cancelled: ") and why in err, err
    code, out, err = run("result", later_id)
    assert code == Exit.FAILURE and "cancelled" in err
    code, out, err = run("result", "nosuchjob-1", "--json")
    assert code == Exit.FAILURE and json.loads(out)["state"] == "unknown"

    os.kill(manager.proc.pid, signal.SIGTERM)  # a clean stop keeps pending jobs pending
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    again = serve_store(procs, store, "--workers", "1")
    code, out, err = run("result", soon_id, "--wait", "--timeout", "60", on=again)
    assert (code, out) == (Exit.OK, '"after"\n'), err
    assert run("result", done_id, on=again)[:2] == (Exit.OK, "2432902008176640000\n")


# ------------------------------------------------------------------------------ in process


def test_new_options_and_commands_have_help_with_units_and_examples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command, option, unit in [
        ("serve", "--result-ttl", "seconds"),
        ("serve", "--store", "sqlite file"),
        ("serve", "--durability", "power cut"),
        ("result", "--timeout", "seconds"),
        ("jobs", "--json", "seconds"),
        ("status", "--json", "bytes"),
    ]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split()).lower()
        assert option in out and unit in out, (command, option)
    for command in ("jobs", "cancel", "result"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert f"python -m mpsched {command}" in out and AUTHKEY_ENV in out
    assert "store" in EXIT_MEANINGS[Exit.STORE] and "result" in EXIT_MEANINGS[Exit.JOB_TIMEOUT]


def test_a_relative_store_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert store_path("jobs.db") == os.path.realpath(tmp_path / "jobs.db")
    assert store_path("") is None and store_path(None) is None


def test_status_text_shows_the_store_and_its_size() -> None:
    assert format_size(512) == "512 bytes" and format_size(1234567) == "1.2 MiB"
    assert format_size(3 * 2**30) == "3.0 GiB"
    assert format_store("/var/lib/jobs.db", 12 * 1024) == "/var/lib/jobs.db, 12.0 KiB"
    assert format_store("memory", None).startswith("memory (jobs end with the manager")
    queue = QueueStats(
        pending={"high": 0, "medium": 0, "low": 0},
        in_flight=0,
        submitted=0,
        completed=0,
        failed=0,
        cancelled=0,
        retried=0,
        timed_out=0,
        started_early=0,
        next_due_in=None,
        lateness={"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0},
        lateness_samples=0,
        wakeups=0,
        waiting=0,
    )
    stats = Stats(
        queue, (), uptime=1.0, throughput=0.0, store="/var/lib/jobs.db", store_size=1234567
    )
    assert "\nstore     /var/lib/jobs.db, 1.2 MiB\n" in format_stats(stats, "unix:/m", 0.0)


def test_the_jobs_table_shows_due_times_as_local_time_and_a_wait() -> None:
    now = datetime(2026, 12, 3, 9, 0, 0).timestamp()

    def info(job_id: str, state: str, due_in: float, worker: str | None = None) -> JobInfo:
        due = datetime.fromtimestamp(now + due_in, timezone.utc)
        return JobInfo(
            job_id=job_id,
            name="mymod.crunch",
            state=state,
            due=due,
            priority=Priority.LOW,
            attempts=1 if worker else 0,
            worker=worker,
            key=None,
        )

    table = format_jobs(
        [
            info("a-1", "pending", 185),
            info("a-2", "pending", -1.25),
            info("a-3", "done", -7300, "w1"),
        ],
        now,
    )
    header, first, second, third = table.splitlines()
    assert header.split() == [
        "id",
        "name",
        "state",
        "due",
        "priority",
        "attempts",
        "worker",
        "progress",
        "last",
        "error",
    ]
    assert first.split() == [
        "a-1",
        "mymod.crunch",
        "pending",
        datetime.fromtimestamp(now + 185).astimezone().isoformat(timespec="seconds"),
        "(in",
        "3",
        "min",
        "05",
        "s)",
        "low",
        "0",
        "-",
        "-",
        "-",
    ]
    assert "(overdue by 1.2 s)" in second and "(2 h 01 min ago)" in third
    assert third.split()[-5:] == ["low", "1", "w1", "-", "-"]
    assert header.index("state") == first.index("pending") == second.index("pending")
    assert format_jobs([], now) == "no jobs\n"


@pytest.mark.parametrize("command", [["jobs"], ["cancel", "a-1"], ["result", "a-1", "--wait"]])
def test_the_job_commands_say_when_no_manager_answers(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"secret\n")
    key.chmod(0o600)
    address = f"unix:{tmp_path}/none.sock"
    assert main([*command, "--connect", address, "--authkey-file", str(key)]) == Exit.UNREACHABLE
    err = capsys.readouterr().err
    assert err == (
        f"mpsched: no manager answers at {address}: nothing is listening there "
        f"(no such socket file)\n"
    )
