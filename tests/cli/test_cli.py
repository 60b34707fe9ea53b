"""``python -m mpsched`` end to end: real serve, worker, submit, status and stress processes
(started and killed by tests/served.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import jobs
import psutil
import pytest
from processes import assert_gone, wait_for, wait_started
from served import START_TIMEOUT, Manager, Processes, pool_workers, serve, start_pool

import mpsched
from mpsched import AuthenticationError, SchedulerShutdownError, VersionMismatchError
from mpsched._cli.main import main
from mpsched._protocol.records import (
    ClientHello,
    Exit,
    WorkerHello,
)
from mpsched._transport.address import parse_address
from mpsched._transport.authkey import AUTHKEY_ENV
from mpsched._transport.connect import HANDSHAKE_TIMEOUT
from mpsched._transport.sockets import describe_versions

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    kind: str  # "tcp" or "unix"
    manager: Manager


@pytest.fixture(scope="module", params=["tcp", "unix"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """``serve`` (no local workers) and two ``worker --connect`` pools of one process each,
    over TCP loopback or over the default private Unix socket."""
    procs = Processes(tmp_path_factory.mktemp(f"cluster-{request.param}"))
    try:
        address = ["--address", "127.0.0.1:0"] if request.param == "tcp" else []
        manager = serve(procs, *address, "--workers", "0")
        pools = [start_pool(procs, manager) for _ in range(2)]
        wait_for(
            lambda: all(len(pool_workers(manager, p)) == 1 for p in pools),
            START_TIMEOUT,
            "both pools joined",
        )
        yield Cluster(request.param, manager)
    finally:
        procs.stop_all()


# ------------------------------------------------------------------------------ end to end


CLIENT = textwrap.dedent("""
    import json, os, sys, time
    import mpsched

    def nap(seconds):
        time.sleep(seconds)
        return os.getpid()

    client = mpsched.connect(sys.argv[1])  # the key comes from MPSCHED_AUTHKEY
    futures = [client.submit(nap, 0.5) for _ in range(4)]
    print(json.dumps(sorted({f.result(timeout=60) for f in futures})), flush=True)
    client.shutdown()
""")


def test_serve_prints_its_address_and_a_private_0600_key_file(cluster: Cluster) -> None:
    manager = cluster.manager
    if cluster.kind == "tcp":
        assert re.fullmatch(r"127\.0\.0\.1:\d+", manager.address)
        assert int(manager.address.rpartition(":")[2]) != 0
    else:
        assert manager.address.startswith("unix:")
        assert Path(manager.address[len("unix:") :]).parent == manager.key_file.parent
    assert stat.S_IMODE(manager.key_file.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(manager.key_file.stat().st_mode) == 0o600
    assert len(manager.key) >= 32


def test_remote_workers_run_jobs_of_clients_in_other_processes(
    cluster: Cluster, procs: Processes
) -> None:
    manager = cluster.manager
    submitted = procs.run("submit", "math:factorial", "--args", "[20]", "--wait", *manager.cli())
    assert submitted.returncode == Exit.OK, submitted.stderr
    job_id, result = submitted.stdout.splitlines()
    assert result == "2432902008176640000" and job_id

    client = procs.run("-c", CLIENT, manager.address, env={AUTHKEY_ENV: manager.key.decode()})
    assert client.returncode == 0, client.stderr
    ran_on = set(json.loads(client.stdout))
    assert ran_on == {w.pid for w in manager.remote_workers()}  # both pools took jobs


def test_status_json_shows_queue_workers_and_lateness(
    cluster: Cluster,
    procs: Processes,
    connect_client: Callable[..., mpsched.Client],
    fifo: str,
    tmp_path: Path,
) -> None:
    manager = cluster.manager
    client = connect_client(manager)
    release = tmp_path / "release"
    later = client.schedule(jobs.noop, delay=3600, priority="high")
    # Runs until released: a `status` started on a loaded machine still finds it running.
    running = client.submit(jobs.announce_then_wait, fifo, str(release), 60.0)
    try:
        job_pid, done_before = _check_status_json(manager, procs, fifo, running.job_id)
    finally:  # the cluster is shared by the module's tests: leave it idle
        release.touch()
        later.cancel()
    assert running.result(timeout=30) == "woke"
    wait_for(
        lambda: {w.pid: w for w in manager.stats().workers}[job_pid].current_job is None,
        what="the report reached the manager",
    )
    [after] = [w for w in manager.stats().workers if w.pid == job_pid]
    assert after.jobs_done == done_before + 1


def _check_status_json(
    manager: Manager, procs: Processes, fifo: str, job_id: str
) -> tuple[int, int]:
    """``status --json`` and ``status`` while a job runs; its worker's pid and job count."""
    [job_pid] = wait_started(fifo)
    shown = procs.run("status", "--json", *manager.cli())
    assert shown.returncode == Exit.OK, shown.stderr
    status = json.loads(shown.stdout)
    q = status["queue"]
    assert set(q["pending"]) == {"high", "medium", "low"}
    assert q["pending"]["high"] >= 1
    assert q["in_flight"] >= 1 and q["next_due_in"] > 3000
    assert set(q["lateness"]) == {"p50", "p90", "p99", "max"}
    assert (
        q["lateness"]["p50"] <= q["lateness"]["p90"] <= q["lateness"]["p99"] <= q["lateness"]["max"]
    )
    assert isinstance(status["throughput"], float) and status["throughput"] >= 0
    assert status["uptime"] > 0
    workers = {w["pid"]: w for w in status["workers"]}
    assert set(workers) == {w.pid for w in manager.remote_workers()} and len(workers) == 2
    for worker in workers.values():
        assert worker["host"] == socket.gethostname() and worker["remote"] is True
        assert worker["rss"] > 0 and worker["cpu_percent"] >= 0
        assert isinstance(worker["jobs_done"], int)
    assert workers[job_pid]["current_job"] == job_id
    text = procs.run("status", *manager.cli())
    assert text.returncode == Exit.OK, text.stderr
    assert "workers   2" in text.stdout and "lateness  p50" in text.stdout
    assert str(job_pid) in text.stdout
    return job_pid, workers[job_pid]["jobs_done"]


def test_submit_prints_the_result_and_exits_1_when_the_job_fails(
    cluster: Cluster, procs: Processes, tmp_path: Path
) -> None:
    manager = cluster.manager
    ok = procs.run(
        "submit",
        "jobs:noop",
        "--kwargs",
        '{"x": [1, "two"]}',
        "--priority",
        "high",
        "--wait",
        *manager.cli(),
    )
    assert ok.returncode == Exit.OK, ok.stderr
    assert ok.stdout.splitlines()[1] == '[1, "two"]'

    failed = procs.run("submit", "math:sqrt", "--args", "[-1]", "--wait", *manager.cli())
    assert failed.returncode == Exit.FAILURE
    job_id = failed.stdout.strip()
    assert f"job {job_id} failed: ValueError: math domain error" in failed.stderr

    log = tmp_path / "ran.log"
    fire = procs.run(
        "submit",
        "jobs:record",
        "--args",
        json.dumps([str(log), "k1"]),
        "--delay",
        "0.2",
        *manager.cli(),
    )
    assert fire.returncode == Exit.OK, fire.stderr
    wait_for(lambda: log.exists() and log.read_text() == "k1\n", what="the job ran")


def test_a_failed_job_shows_the_worker_s_traceback(cluster: Cluster, procs: Processes) -> None:
    manager = cluster.manager
    failed = procs.run("submit", "jobs:fail", "--args", '["boom"]', "--wait", *manager.cli())
    assert failed.returncode == Exit.FAILURE
    job_id = failed.stdout.strip()
    where = f'File "{jobs.__file__}", line {jobs.fail.__code__.co_firstlineno + 1}, in fail'
    err = failed.stderr
    assert err.startswith(
        f"job {job_id} failed: ValueError: boom\nthe worker's traceback:\n"
        f"Traceback (most recent call last):\n"
    ), err
    assert where in err and err.endswith("ValueError: boom\n"), err

    # Without a store a manager forgets a job once its outcome is collected: `result`
    # waits for jobs of its own.
    def later() -> str:
        done = procs.run(
            "submit", "jobs:fail", "--args", '["boom"]', "--delay", "0.5", *manager.cli()
        )
        assert done.returncode == Exit.OK, done.stderr
        return done.stdout.strip()

    job_id = later()
    shown = procs.run("result", job_id, "--wait", *manager.cli())
    assert shown.returncode == Exit.FAILURE
    assert shown.stderr == err.replace(failed.stdout.strip(), job_id)

    as_json = procs.run("result", later(), "--wait", "--json", *manager.cli())
    assert as_json.returncode == Exit.FAILURE, as_json.stderr
    error = json.loads(as_json.stdout)["error"]
    assert error["type"] == "ValueError" and error["message"] == "boom"
    assert where in error["traceback"] and error["traceback"].endswith("ValueError: boom\n")


def test_a_result_json_cannot_hold_prints_as_its_repr_and_says_so(
    cluster: Cluster, procs: Processes
) -> None:
    manager = cluster.manager
    done = procs.run("submit", "builtins:set", "--args", "[[1, 2]]", "--wait", *manager.cli())
    assert done.returncode == Exit.OK, done.stderr
    job_id, printed = done.stdout.splitlines()
    assert printed == "{1, 2}"
    assert done.stderr == (
        f"mpsched: job {job_id} returned a set, which JSON cannot hold: its repr follows\n"
    )
    as_json = procs.run("submit", "builtins:sorted", "--args", "[[2, 1]]", "--wait", *manager.cli())
    assert as_json.stdout.splitlines()[1] == "[1, 2]" and as_json.stderr == ""
    later = procs.run(
        "submit", "builtins:set", "--args", "[[1, 2]]", "--delay", "0.5", *manager.cli()
    ).stdout.strip()
    shown = procs.run("result", later, "--wait", "--json", *manager.cli())
    assert shown.returncode == Exit.OK, shown.stderr
    assert json.loads(shown.stdout) == {"job_id": later, "state": "done", "result_repr": "{1, 2}"}


def test_submit_key_queues_one_job_per_key(cluster: Cluster, procs: Processes) -> None:
    manager = cluster.manager
    ids = []
    for _ in range(2):
        done = procs.run(
            "submit", "jobs:noop", "--delay", "3600", "--key", "nightly-report", *manager.cli()
        )
        assert done.returncode == Exit.OK, done.stderr
        ids.append(done.stdout.strip())
    try:
        assert ids[0] == ids[1] and manager.stats().queue.pending["medium"] == 1
    finally:
        assert manager.service().cancel(ids[0])


TEXT_KEY_CLIENT = textwrap.dedent("""
    import sys
    import mpsched

    with open(sys.argv[2]) as key_file:
        text = key_file.read()  # the key as text, its trailing newline and all
    assert text.endswith("\\n")
    client = mpsched.connect(sys.argv[1], authkey=text)
    print(client.submit(pow, 2, 5).result(timeout=60), flush=True)
    client.shutdown()
""")


def test_connect_takes_the_text_of_a_key_file(cluster: Cluster, procs: Processes) -> None:
    manager = cluster.manager
    # In a process of its own, as a program would: no proxy of another test shares its
    # connection to the manager.
    done = procs.run("-c", TEXT_KEY_CLIENT, manager.address, str(manager.key_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "32\n"


CLIENT_ONLY = "only_the_client_has_it"


def test_submit_by_value_sends_a_module_the_workers_cannot_import(
    cluster: Cluster, procs: Processes, tmp_path: Path
) -> None:
    manager = cluster.manager
    source = tmp_path / f"{CLIENT_ONLY}.py"
    source.write_text(
        "def triple(x):\n    return 3 * x\n\n\ndef fail():\n    raise ValueError('sent by value')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), procs.env["PYTHONPATH"]])}
    missing = procs.run(
        "submit", f"{CLIENT_ONLY}:triple", "--args", "[2]", "--wait", *manager.cli(), env=env
    )
    assert missing.returncode == Exit.FAILURE
    err = missing.stderr
    assert "JobUnpicklingError" in err and f"No module named '{CLIENT_ONLY}'" in err, err
    pids = {w.pid for w in manager.remote_workers()}
    assert any(f"the worker on {socket.gethostname()} (pid {pid})" in err for pid in pids), err
    assert "this worker's sys.path: [" in err and "submit --by-value MODULE" in err, err

    sent = procs.run(
        "submit",
        f"{CLIENT_ONLY}:triple",
        "--args",
        "[2]",
        "--wait",
        "--by-value",
        CLIENT_ONLY,
        *manager.cli(),
        env=env,
    )
    assert sent.returncode == Exit.OK, sent.stderr
    assert sent.stdout.splitlines()[1] == "6"
    failed = procs.run(
        "submit",
        f"{CLIENT_ONLY}:fail",
        "--wait",
        "--by-value",
        CLIENT_ONLY,
        *manager.cli(),
        env=env,
    )
    assert failed.returncode == Exit.FAILURE
    assert f'File "{source}", line 6, in fail' in failed.stderr, failed.stderr
    unknown = procs.run(
        "submit", f"{CLIENT_ONLY}:triple", "--by-value", "no_such_module", *manager.cli(), env=env
    )
    assert unknown.returncode == Exit.USAGE
    assert unknown.stderr.startswith("mpsched: --by-value no_such_module: cannot import it")


def test_ctrl_c_on_submit_wait_says_a_running_job_keeps_running(
    cluster: Cluster, procs: Processes, fifo: str, tmp_path: Path
) -> None:
    manager = cluster.manager
    release = tmp_path / "release"
    waiting = procs.start(
        "submit",
        "jobs:announce_then_wait",
        "--args",
        json.dumps([fifo, str(release), 60.0]),
        "--wait",
        *manager.cli(),
    )
    job_id = waiting.line()
    try:
        wait_started(fifo)
        os.kill(waiting.pid, signal.SIGINT)
        assert waiting.wait(10) == Exit.INTERRUPTED
        err = waiting.stderr()
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert (
            f"job {job_id} is running and will finish: python -m mpsched result {job_id} "
            f"--wait gets its result" in err
        ), err
        assert "queued" not in err and "cancel" not in err, err
    finally:  # the cluster serves the next tests: let the job end in any case
        release.touch()


def test_ctrl_c_on_submit_wait_exits_at_once_and_leaves_the_job_queued(
    cluster: Cluster, procs: Processes
) -> None:
    manager = cluster.manager
    waiting = procs.start("submit", "jobs:noop", "--delay", "3600", "--wait", *manager.cli())
    job_id = waiting.line()
    try:
        t0 = time.monotonic()
        os.kill(waiting.pid, signal.SIGINT)
        assert waiting.wait(10) == Exit.INTERRUPTED == 128 + signal.SIGINT
        assert time.monotonic() - t0 < 5  # not the result thread's long poll, nor a shutdown
        err = waiting.stderr()
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"job {job_id} stays queued" in err, err
        assert f"mpsched result {job_id} --wait" in err and f"mpsched cancel {job_id}" in err
    finally:  # the cluster serves the next tests: take the job out in any case
        still_queued = manager.service().cancel(job_id)
    assert still_queued


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["no_such_module:f"], "no_such_module", id="unimportable-module"),
        pytest.param(["math:no_such_function"], "no_such_function", id="missing-function"),
        pytest.param(["math"], "module:function", id="not-a-target"),
        pytest.param(["math:factorial", "--args", "[20"], "--args", id="args-not-json"),
        pytest.param(["math:factorial", "--args", '{"a": 1}'], "JSON list", id="args-not-list"),
        pytest.param(["math:factorial", "--at", "noon"], "--at", id="bad-at"),
        pytest.param(["math:factorial", "--delay", "nan"], "delay", id="nan-delay"),
        pytest.param(["math:factorial", "--delay", "1e300"], "year 9999", id="delay-past-9999"),
        pytest.param(["math:factorial", "--timeout", "-1"], "timeout", id="negative-timeout"),
        pytest.param(["math:factorial", "--retries", "-1"], "retries", id="negative-retries"),
    ],
)
def test_submit_refuses_bad_input_as_a_usage_error(
    cluster: Cluster, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", *argv, *cluster.manager.cli()]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.startswith("mpsched: ") and message in err
    assert sum(cluster.manager.stats().pending.values()) == 0  # nothing was queued


def test_wrong_key_is_refused_clearly_and_the_manager_keeps_working(
    cluster: Cluster, procs: Processes, tmp_path: Path
) -> None:
    manager = cluster.manager
    with pytest.raises(AuthenticationError, match="wrong authkey") as caught:
        mpsched.connect(manager.address, authkey=b"not the key")
    assert isinstance(caught.value, mpsched.MpschedError)

    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(b"not the key\n")
    wrong.chmod(0o600)
    for command in (
        ["status"],
        ["submit", "math:factorial", "--args", "[3]", "--wait"],
        ["worker", "--processes", "1"],
    ):
        refused = procs.run(*command, *manager.cli(wrong))
        assert refused.returncode == Exit.AUTH, (command, refused.stderr)
        assert "wrong authkey" in refused.stderr and "Traceback" not in refused.stderr

    submitted = procs.run("submit", "math:factorial", "--args", "[3]", "--wait", *manager.cli())
    assert submitted.returncode == Exit.OK and submitted.stdout.splitlines()[1] == "6"
    assert len(manager.remote_workers()) == 2


def test_a_different_python_or_cloudpickle_version_is_refused(cluster: Cluster) -> None:
    manager = cluster.manager
    python, cp = describe_versions()
    service = manager.service()
    with pytest.raises(VersionMismatchError) as caught:
        service.hello(WorkerHello("impostor", 1, "elsewhere", "2.7", cp, remote=True))
    message = str(caught.value)
    assert f"Python 2.7 with cloudpickle {cp}" in message
    assert f"manager runs Python {python} with cloudpickle {cp}" in message

    with pytest.raises(VersionMismatchError) as caught:
        service.open_client(ClientHello("old-client", python, "0.0.1"))
    message = str(caught.value)
    assert "cloudpickle 0.0.1" in message and f"cloudpickle {cp}" in message
    assert python in message
    assert all(w.worker_id != "impostor" for w in manager.stats().workers)
    assert len(manager.remote_workers()) == 2


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["worker", "--processes", "1"], id="worker"),
        pytest.param(["submit", "math:factorial", "--args", "[3]", "--wait"], id="submit"),
    ],
)
def test_the_cli_exits_with_version_when_refused(
    cluster: Cluster,
    command: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    python, cp = describe_versions()
    # an old install
    for module in ("mpsched._transport.sockets", "mpsched._client.core", "mpsched._cli.main"):
        monkeypatch.setattr(f"{module}.describe_versions", lambda: ("3.0", cp))
    assert main([*command, *cluster.manager.cli()]) == Exit.VERSION
    err = capsys.readouterr().err
    assert "refused" in err and "Python 3.0" in err and f"Python {python}" in err
    assert len(cluster.manager.remote_workers()) == 2


def test_stress_against_a_running_manager_with_remote_workers(
    cluster: Cluster, procs: Processes
) -> None:
    done = procs.run(
        "stress",
        "--producers",
        "2",
        "--jobs",
        "200",
        "--horizon",
        "0.5",
        *cluster.manager.cli(),
        timeout=120,
    )
    assert done.returncode == Exit.OK, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "OK: 200 jobs ran exactly once, none early"


# ------------------------------------------------------------------------------ faults


@pytest.mark.parametrize("retries", [0, 1], ids=["no-retry", "retry"])
def test_a_remote_worker_killed_mid_job_is_resolved_within_the_heartbeat_timeout(
    procs: Processes,
    connect_client: Callable[..., mpsched.Client],
    fifo: str,
    tmp_path: Path,
    retries: int,
) -> None:
    heartbeat_timeout = 2.0
    manager = serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--heartbeat-timeout",
        str(heartbeat_timeout),
    )
    pool = start_pool(procs, manager)
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "pool joined")
    client = connect_client(manager)
    if retries:
        future = client.schedule(jobs.die_once, str(tmp_path / "marker"), retries=1)
        t0 = time.monotonic()  # the job SIGKILLs its worker the first time
        assert future.result(timeout=30) == "survived"
        assert manager.stats().queue.retried == 1
    else:
        future = client.schedule(jobs.announce_then_sleep, fifo, 60)
        [pid] = wait_started(fifo)
        assert [w.pid for w in pool_workers(manager, pool)] == [pid]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        error = future.exception(timeout=30)
        assert isinstance(error, mpsched.WorkerCrashedError), error
        # Its pool told the manager how it died: the error names the signal.
        assert future.job_id in str(error) and "was killed by signal SIGKILL" in str(error)
        assert manager.stats().failed == 1
    assert time.monotonic() - t0 < heartbeat_timeout + 5
    # The pool replaced its worker, which takes jobs.
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, what="replacement joined")
    replacement = client.submit(jobs.pid).result(timeout=30)
    assert replacement in {p.pid for p in pool.descendants()}


def test_a_busy_remote_worker_with_default_heartbeats_survives_a_short_heartbeat_timeout(
    procs: Processes, connect_client: Callable[..., mpsched.Client]
) -> None:
    # Only the manager is told the timeout (shorter than the worker's default heartbeat
    # interval, 2 s); the worker's heartbeats must keep up with it.
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "1.5"
    )
    pool = procs.start("worker", *manager.cli(), "--processes", "1")
    pool.line()
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "pool joined")
    client = connect_client(manager)
    assert client.submit(time.sleep, 4).result(timeout=30) is None
    assert manager.stats().failed == 0


def test_sigterm_drains_a_remote_pool(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    # A long heartbeat timeout: only a proper leave removes the workers in time.
    manager = serve(
        procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "60"
    )
    pool = start_pool(procs, manager, processes=2)
    wait_for(lambda: len(pool_workers(manager, pool)) == 2, START_TIMEOUT, "pool joined")
    children = procs.note_descendants(pool)
    client = connect_client(manager)
    running = client.submit(jobs.announce_then_sleep, fifo, 3.0)
    wait_started(fifo)
    # Due while the running job still runs: the draining pool must not take it.
    later = client.schedule(jobs.noop, "late", delay=1.5)
    os.kill(pool.pid, signal.SIGTERM)
    assert running.result(timeout=30) == "woke"
    assert pool.wait() == Exit.OK, pool.stderr()
    assert_gone(children)
    wait_for(lambda: not manager.stats().workers, 5, "the pool's workers left")
    stats = manager.stats()
    assert stats.pending["medium"] == 1 and stats.in_flight == 0 and stats.failed == 0
    assert not later.done() and later.cancel()


def test_a_second_sigterm_kills_a_remote_pool(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--heartbeat-timeout", "2")
    pool = start_pool(procs, manager)
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "pool joined")
    children = procs.note_descendants(pool)
    client = connect_client(manager)
    stuck = client.submit(jobs.announce_then_sleep, fifo, 60)
    wait_started(fifo)
    os.kill(pool.pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(pool.pid, signal.SIGTERM)
    assert pool.wait(10) == 128 + signal.SIGTERM, pool.stderr()
    assert_gone(children)
    assert isinstance(stuck.exception(timeout=30), mpsched.WorkerCrashedError)


def test_serve_sigterm_finishes_the_running_job_and_leaves_no_process(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--workers", "1")
    runtime = Path(manager.address[len("unix:") :]).parent
    client = connect_client(manager)
    running = client.submit(jobs.announce_then_sleep, fifo, 1.5)
    [job_pid] = wait_started(fifo)
    never = client.schedule(jobs.noop, delay=3600)
    family = procs.note_descendants(manager.proc)
    assert job_pid in {p.pid for p in family}
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert running.result(timeout=30) == "woke"
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    assert isinstance(never.exception(timeout=30), SchedulerShutdownError)
    assert_gone(family)
    # Its socket is gone; the local key and the lock file stay for the next serve.
    assert sorted(p.name for p in runtime.iterdir()) == ["authkey", "manager.pid"]


def test_serve_sigterm_delivers_the_result_of_a_job_on_a_remote_worker(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    pool = start_pool(procs, manager)
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "pool joined")
    client = connect_client(manager)
    running = client.submit(jobs.announce_then_sleep, fifo, 0.5)
    wait_started(fifo)
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert running.result(timeout=30) == "woke"
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    # The pool waits for the manager to come back (drain-workers-on-stop would end it).
    wait_for(
        lambda: "joining it again once it is back" in pool.stderr(),
        30,
        "the pool heard of the stop",
    )
    assert pool.popen.poll() is None, pool.stderr()


def test_serve_sigterm_kills_a_job_that_outlives_the_drain_timeout(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1", "--drain-timeout", "1")
    client = connect_client(manager)
    stuck = client.submit(jobs.announce_then_sleep, fifo, 60)
    wait_started(fifo)
    family = procs.note_descendants(manager.proc)
    os.kill(manager.proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    assert manager.proc.wait() == Exit.OK, manager.proc.stderr()
    assert time.monotonic() - t0 < 1 + 2 + 5  # drain timeout, worker stop grace, margin
    assert_gone(family)
    assert isinstance(stuck.exception(timeout=30), mpsched.MpschedError)


def test_a_second_sigterm_stops_serve_at_once(
    procs: Processes, connect_client: Callable[..., mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1")
    client = connect_client(manager)
    stuck = client.submit(jobs.announce_then_sleep, fifo, 60)
    wait_started(fifo)
    family = procs.note_descendants(manager.proc)
    os.kill(manager.proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert manager.proc.wait(10) == 128 + signal.SIGTERM, manager.proc.stderr()
    assert_gone(family)
    assert isinstance(stuck.exception(timeout=30), SchedulerShutdownError)


def make_key_file(path: Path) -> Path:
    path.write_bytes(b"a key for a test\n")
    path.chmod(0o600)
    return path


def test_a_clean_stop_of_serve_prints_no_traceback_and_leaves_no_file(
    procs: Processes, tmp_path: Path
) -> None:
    tmp = tmp_path / "tmp"  # multiprocessing's pymp-* directories go here
    tmp.mkdir()
    manager = serve(procs, "--workers", "1", env={"TMPDIR": str(tmp)})
    runtime = Path(manager.address[len("unix:") :]).parent
    assert [p.name[:5] for p in tmp.iterdir()] == ["pymp-"]  # the forkserver's socket
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert manager.proc.wait() == Exit.OK
    assert "Traceback" not in manager.proc.stderr(), manager.proc.stderr()
    assert sorted(p.name for p in runtime.iterdir()) == ["authkey", "manager.pid"]
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("where", ["local", "unix-path"])
def test_a_second_sigterm_leaves_no_file_and_serve_starts_again(
    procs: Processes,
    connect_client: Callable[..., mpsched.Client],
    fifo: str,
    tmp_path: Path,
    where: str,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    args = []
    if where == "unix-path":
        args = [
            "--address",
            f"unix:{procs.runtime_dir}/m.sock",
            "--authkey-file",
            str(make_key_file(tmp_path / "key")),
        ]
    manager = serve(procs, *args, "--workers", "1", env=env)
    socket_path = Path(manager.address[len("unix:") :])
    client = connect_client(manager)
    client.submit(jobs.announce_then_sleep, fifo, 60)
    wait_started(fifo)
    family = procs.note_descendants(manager.proc)
    os.kill(manager.proc.pid, signal.SIGTERM)
    wait_for(lambda: "draining" in manager.proc.stderr(), what="the first SIGTERM handled")
    os.kill(manager.proc.pid, signal.SIGTERM)
    assert manager.proc.wait(10) == Exit.TERMINATED, manager.proc.stderr()
    assert "Traceback" not in manager.proc.stderr(), manager.proc.stderr()
    assert_gone(family)
    assert not socket_path.exists() and list(tmp.iterdir()) == []
    if where == "local":  # what stays is the local key and the lock file, for the next
        assert sorted(p.name for p in socket_path.parent.iterdir()) == ["authkey", "manager.pid"]
    again = serve(procs, *args, "--workers", "0", env=env)
    assert again.address == manager.address and again.key == manager.key
    # A fresh process: this one's proxies keep a connection per address, now dead.
    status = procs.run("status", *again.cli())
    assert status.returncode == Exit.OK, status.stderr


def test_serve_removes_a_stale_socket_and_refuses_a_live_one(
    procs: Processes, tmp_path: Path
) -> None:
    socket_path = procs.runtime_dir / "m.sock"
    key = make_key_file(tmp_path / "key")
    args = ["--address", f"unix:{socket_path}", "--authkey-file", str(key), "--workers", "0"]
    tmp = tmp_path / "tmp"  # what the SIGKILL below leaves of multiprocessing's files
    tmp.mkdir()
    first = serve(procs, *args, env={"TMPDIR": str(tmp)})
    live = procs.run("serve", *args, timeout=30)
    assert live.returncode == Exit.USAGE, live.stderr
    assert "another process is listening there" in live.stderr
    assert first.stats().uptime > 0  # undisturbed
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    assert socket_path.exists()  # nothing can clean up after SIGKILL...
    again = serve(procs, *args)  # ...so the next serve does
    status = procs.run("status", *again.cli())  # (this process has a dead connection there)
    assert status.returncode == Exit.OK, status.stderr

    not_a_socket = tmp_path / "notes.txt"
    not_a_socket.write_text("mine")
    refused = procs.run(
        "serve",
        "--address",
        f"unix:{not_a_socket}",
        "--authkey-file",
        str(key),
        "--workers",
        "0",
        timeout=30,
    )
    assert refused.returncode == Exit.USAGE and "not a socket" in refused.stderr
    assert not_a_socket.read_text() == "mine"


def test_silent_connections_do_not_pin_manager_threads(procs: Processes) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    process = psutil.Process(manager.proc.pid)
    address = parse_address(manager.address)
    assert isinstance(address, tuple)  # a TCP one
    host, port = address
    baseline = process.num_threads()
    silent: list[socket.socket] = []
    try:
        for source in ("127.0.0.2", "127.0.0.3"):  # each under its address's cap
            for _ in range(25):
                silent.append(
                    socket.create_connection((host, port), timeout=10, source_address=(source, 0))
                )
        for sock in silent:  # each one is in its handshake: it got the challenge
            data = b""
            while b"#CHALLENGE#" not in data:
                chunk = sock.recv(4096)
                assert chunk, "closed before the challenge"
                data += chunk
        assert process.num_threads() <= baseline + 2  # and holds no thread
        t0 = time.monotonic()
        assert manager.stats().uptime > 0  # a real client is served meanwhile
        assert time.monotonic() - t0 < HANDSHAKE_TIMEOUT
        for sock in silent:  # dropped at the deadline
            assert sock.recv(4096) == b""
    finally:
        for sock in silent:
            sock.close()


# ------------------------------------------------------------------------------ refusals


def test_serve_counts_its_local_workers_in_words(procs: Processes) -> None:
    proc = procs.start("serve", "--workers", "1")
    first = proc.line()
    assert re.search(r"\(pid \d+, 1 local worker, key \S+\)$", first), first


def test_serve_refuses_a_public_address_without_a_key(procs: Processes) -> None:
    for address in ("0.0.0.0:0", "192.0.2.1:0", "example.org:0"):
        refused = procs.run("serve", "--address", address, "--workers", "0", timeout=30)
        assert refused.returncode == Exit.UNSAFE, refused.stderr
        assert "refusing to serve" in refused.stderr and AUTHKEY_ENV in refused.stderr
        assert "--authkey-file" in refused.stderr


def test_serve_says_when_it_cannot_listen(procs: Processes, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = procs.run("serve", "--address", f"127.0.0.1:{port}", "--workers", "0", timeout=30)
    assert busy.returncode == Exit.USAGE, busy.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    nowhere = procs.run(
        "serve", "--address", f"unix:{tmp_path}/no/such/dir.sock", "--workers", "0", timeout=30
    )
    assert nowhere.returncode == Exit.USAGE and "cannot listen" in nowhere.stderr
    assert "Traceback" not in busy.stderr + nowhere.stderr


def test_serve_says_in_one_line_when_its_status_page_cannot_listen(procs: Processes) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = procs.run("serve", "--workers", "0", "--http", f"127.0.0.1:{port}", timeout=30)
    assert busy.returncode == Exit.USAGE, busy.stderr  # not 1: that is a failed job's
    assert busy.stderr.strip() == (
        f"mpsched: cannot serve the status page on 127.0.0.1:{port}: Address already in use"
    ), busy.stderr
    again = procs.run("status", timeout=30)  # it left no manager behind, nor its lock
    assert again.returncode != Exit.OK and "Traceback" not in again.stderr, again.stderr


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["worker", "--processes", "0"], id="worker-no-processes"),
        pytest.param(["worker", "--heartbeat-interval", "0"], id="worker-zero-heartbeat"),
        pytest.param(["serve", "--heartbeat-timeout", "-1"], id="serve-negative-heartbeat"),
        pytest.param(["serve", "--max-pending", "0"], id="serve-max-pending-0"),
        pytest.param(["serve", "--max-pending-bytes", "0"], id="serve-max-pending-bytes-0"),
        pytest.param(["stress", "--jobs", "0"], id="stress-no-jobs"),
        pytest.param(["stress", "--horizon", "inf"], id="stress-infinite-horizon"),
    ],
)
def test_bad_numbers_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--connect", "127.0.0.1:1"] if argv[0] == "worker" else argv)
    assert exited.value.code == Exit.USAGE
    assert f"argument {argv[1]}" in capsys.readouterr().err


def test_key_files_others_can_read_are_refused(procs: Processes, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(b"secret\n")
    key_file.chmod(0o644)
    for command in (
        ["serve", "--address", "127.0.0.1:0", "--workers", "0"],
        ["status", "--connect", "127.0.0.1:1"],
        ["worker", "--connect", "127.0.0.1:1"],
    ):
        refused = procs.run(*command, "--authkey-file", str(key_file), timeout=30)
        assert refused.returncode == Exit.AUTH, (command, refused.stderr)
        assert "chmod 600" in refused.stderr and "Traceback" not in refused.stderr


def test_clients_without_a_key_or_a_manager_get_clear_exit_codes(
    procs: Processes, tmp_path: Path
) -> None:
    no_key = procs.run("status", "--connect", "127.0.0.1:1", timeout=30)
    assert no_key.returncode == Exit.AUTH and "no authkey" in no_key.stderr
    key_file = tmp_path / "key"
    key_file.write_bytes(b"secret\n")
    key_file.chmod(0o600)
    nobody = procs.run(
        "status",
        "--connect",
        f"unix:{tmp_path}/none.sock",
        "--authkey-file",
        str(key_file),
        timeout=30,
    )
    assert nobody.returncode == Exit.UNREACHABLE and "no manager answers" in nobody.stderr
    bad = procs.run("status", "--connect", "nowhere", "--authkey-file", str(key_file))
    assert bad.returncode == Exit.USAGE and "HOST:PORT" in bad.stderr


# ------------------------------------------------------------------------------ stress, help


@pytest.mark.parametrize(
    ("inject", "code", "last"),
    [
        pytest.param(None, Exit.OK, "OK: 300 jobs ran exactly once, none early", id="healthy"),
        pytest.param("duplicate", Exit.FAILURE, "FAIL: 1 duplicated", id="duplicate"),
        pytest.param("loss", Exit.FAILURE, "FAIL: 1 lost", id="loss"),
    ],
)
def test_stress_exit_code_says_whether_every_job_ran_once(
    procs: Processes, inject: str | None, code: Exit, last: str
) -> None:
    options = ["--inject", inject] if inject else []
    done = procs.run(
        "stress",
        "--producers",
        "2",
        "--workers",
        "2",
        "--jobs",
        "300",
        "--horizon",
        "0.5",
        *options,
        timeout=120,
    )
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(last), done.stdout
    if inject is None:
        assert "producers count from their submit call" in done.stdout, done.stdout


@pytest.mark.parametrize("command", ["serve", "worker", "submit", "status", "demo", "stress"])
def test_every_subcommand_has_help_with_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"python -m mpsched {command}" in out
    if command == "demo":  # runs its own manager: no key to give
        assert AUTHKEY_ENV not in out and "authkey" not in out
    else:
        assert AUTHKEY_ENV in out


def test_no_subcommand_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == Exit.USAGE
    out = capsys.readouterr().out
    for command in ("serve", "worker", "submit", "status", "demo", "stress"):
        assert command in out


def test_submit_after_runs_a_job_once_its_parent_ended_and_jobs_shows_the_wait(
    cluster: Cluster, procs: Processes, tmp_path: Path
) -> None:
    manager = cluster.manager
    log, release = tmp_path / "ran.log", tmp_path / "release"
    parent = procs.run(  # runs until the test releases it, however slow the commands below
        "submit",
        "jobs:record_once_released",
        "--args",
        json.dumps([str(log), "p", str(release), 60]),
        *manager.cli(),
    )
    assert parent.returncode == Exit.OK, parent.stderr
    parent_id = parent.stdout.strip()
    child = procs.run(
        "submit",
        "jobs:record",
        "--args",
        json.dumps([str(log), "c"]),
        "--after",
        parent_id,
        *manager.cli(),
    )
    assert child.returncode == Exit.OK, child.stderr
    child_id = child.stdout.strip()
    listed = procs.run("jobs", "--json", *manager.cli())
    assert listed.returncode == Exit.OK, listed.stderr
    waits = {job["job_id"]: job["waiting_for"] for job in json.loads(listed.stdout)}
    assert waits[child_id] == "after 1 jobs" and waits[parent_id] is None
    table = procs.run("jobs", *manager.cli())
    assert "pending, after 1 jobs" in table.stdout
    assert not log.exists()
    release.touch()
    done = procs.run("result", child_id, "--wait", *manager.cli())
    assert done.returncode == Exit.OK, done.stderr
    assert log.read_text() == "p\nc\n"
    unknown = procs.run("submit", "jobs:noop", "--after", "no-such-job", *manager.cli())
    assert unknown.returncode != Exit.OK and "no-such-job" in unknown.stderr
