"""This user's local manager end to end: ``serve`` without ``--address`` in one process,
client commands, ``worker`` and ``mpsched.connect()`` without an address or key in others.

Real serve processes (``procs``, tests/served.py), each test with its own
XDG_RUNTIME_DIR (``procs.runtime_dir``), so the local manager's directory is
``procs.runtime_dir / "mpsched"`` and never the real user's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli.test_cli_usage import subparsers
from processes import assert_gone, wait_for
from served import START_TIMEOUT, Processes, pool_workers, serve

import mpsched
from mpsched._cli.parser import build_parser
from mpsched._protocol.records import Exit

pytestmark = pytest.mark.slow

CONNECT_DEFAULT = textwrap.dedent("""
    import mpsched
    client = mpsched.connect()  # no address, no key: this user's local manager
    print(client.submit(pow, 2, 10).result(timeout=60), flush=True)
    client.shutdown()
""")


def local_dir(procs: Processes) -> Path:
    return procs.runtime_dir / "mpsched"


def ok(procs: Processes, *argv: str, timeout: float = 60.0) -> str:
    """Run a command to completion; it must exit 0. Returns its stdout."""
    done = procs.run(*argv, timeout=timeout)
    assert done.returncode == Exit.OK, (argv, done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def in_process_clients(
    procs: Processes, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[mpsched.Client]]:
    """This process sees ``procs``' runtime directory; its clients are detached at the end."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(procs.runtime_dir))
    monkeypatch.delenv("MPSCHED_AUTHKEY", raising=False)
    clients: list[mpsched.Client] = []
    yield clients
    for client in clients:
        client.detach()


# ------------------------------------------------------------------------------ no flags


def test_every_command_finds_the_local_manager_with_no_flags(
    procs: Processes, in_process_clients: list[mpsched.Client]
) -> None:
    manager = serve(procs, "--workers", "0")
    assert manager.address == f"unix:{local_dir(procs)}/manager.sock"
    assert manager.key_file == local_dir(procs) / "authkey"
    assert manager.proc.line() == "  status: python -m mpsched status"  # no flags to give
    pool = procs.start("worker", "--processes", "1", "--heartbeat-interval", "0.5")
    assert pool.line() == f"mpsched worker: 1 process joined {manager.address}"
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "the pool joined")

    assert (
        ok(procs, "submit", "math:factorial", "--args", "[20]", "--wait").splitlines()[1]
        == "2432902008176640000"
    )
    assert "workers   1" in ok(procs, "status")
    later = ok(procs, "submit", "jobs:noop", "--delay", "3600").strip()
    assert [
        job["job_id"] for job in json.loads(ok(procs, "jobs", "--state", "pending", "--json"))
    ] == [later]
    soon = ok(procs, "submit", "math:factorial", "--args", "[6]", "--delay", "1").strip()
    assert json.loads(ok(procs, "result", soon, "--wait", "--json"))["result"] == 720
    assert ok(procs, "cancel", later) == f"cancelled job {later}\n"
    assert ok(procs, "-c", CONNECT_DEFAULT) == "1024\n"  # connect() in another process

    in_process_clients.append(mpsched.connect())  # and in this one
    assert in_process_clients[0].submit(pow, 3, 3).result(timeout=60) == 27


def test_a_second_local_serve_names_the_running_one_and_exits_8(procs: Processes) -> None:
    first = serve(procs, "--workers", "0")
    files = {p: p.read_bytes() for p in local_dir(procs).iterdir() if p.is_file()}
    second = procs.run("serve", "--workers", "0", timeout=60)
    assert second.returncode == int(Exit.RUNNING) == 8, second.stderr
    assert second.stderr == (
        f"mpsched: this user's local manager is already running (pid {first.proc.pid}) on "
        f"{first.address}; python -m mpsched status shows it. Stop it first, or serve "
        f"another with --address.\n"
    )
    assert {p: p.read_bytes() for p in local_dir(procs).iterdir() if p.is_file()} == files
    assert ok(procs, "status").startswith(f"manager {first.address}, up ")  # undisturbed


def test_a_sigkilled_local_serve_is_replaced_and_old_command_lines_keep_working(
    procs: Processes,
) -> None:
    first = serve(procs, "--workers", "1")
    family = procs.note_descendants(first.proc)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    assert_gone(family)  # its workers follow it
    socket_path = local_dir(procs) / "manager.sock"
    assert stat.S_ISSOCK(socket_path.lstat().st_mode)  # stale: nothing could remove it
    assert (local_dir(procs) / "manager.pid").read_text() == f"{first.proc.pid}\n"
    gone = procs.run("status")
    assert gone.returncode == Exit.UNREACHABLE and "nothing is listening" in gone.stderr

    again = serve(procs, "--workers", "1")  # takes the free lock, removes the stale socket
    assert (again.address, again.key) == (first.address, first.key)
    assert (local_dir(procs) / "manager.pid").read_text() == f"{again.proc.pid}\n"
    # What worked with the first one works with this one: no flags, or the printed ones.
    assert ok(procs, "submit", "math:factorial", "--args", "[5]", "--wait").endswith("\n120\n")
    ok(procs, "status", *first.cli())
    assert ok(procs, "-c", CONNECT_DEFAULT) == "1024\n"


def test_connect_reaches_a_restarted_local_manager_from_the_same_process(
    procs: Processes, in_process_clients: list[mpsched.Client]
) -> None:
    first = serve(procs, "--workers", "1")
    in_process_clients.append(mpsched.connect())
    assert in_process_clients[0].submit(pow, 2, 5).result(timeout=60) == 32
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    again = serve(procs, "--workers", "1")
    assert again.address == first.address
    # This thread's cached connection to that address is the dead manager's: not reused.
    in_process_clients.append(mpsched.connect())
    assert in_process_clients[1].submit(pow, 2, 6).result(timeout=60) == 64


@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_a_local_address_without_a_key_uses_the_local_key(procs: Processes, where: str) -> None:
    address = "127.0.0.1:0" if where == "tcp" else f"unix:{procs.runtime_dir}/elsewhere.sock"
    manager = serve(procs, "--address", address, "--workers", "0")
    assert manager.key_file == local_dir(procs) / "authkey"
    assert manager.proc.line() == f"  status: python -m mpsched status --connect {manager.address}"
    assert ok(procs, "status", "--connect", manager.address).startswith(
        f"manager {manager.address}, up "
    )


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp directory with a short path (a socket's path in it must fit in 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mps-tmp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_without_xdg_runtime_dir_the_local_manager_lives_in_the_temp_dir(
    short_tmp: Path, procs: Processes
) -> None:
    procs.env.update({"XDG_RUNTIME_DIR": "", "TMPDIR": str(short_tmp)})
    manager = serve(procs, "--workers", "1")
    directory = short_tmp / f"mpsched-{os.geteuid()}"
    assert manager.address == f"unix:{directory}/manager.sock"
    assert manager.key_file == directory / "authkey"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert ok(procs, "status").startswith(f"manager {manager.address}, up ")
    assert ok(procs, "-c", CONNECT_DEFAULT) == "1024\n"
    assert not local_dir(procs).exists()  # XDG_RUNTIME_DIR was empty: not used


def test_an_unsafe_runtime_directory_is_refused(procs: Processes) -> None:
    local_dir(procs).mkdir(mode=0o700)
    local_dir(procs).chmod(0o755)
    for command in (["serve", "--workers", "0"], ["status"], ["-c", CONNECT_DEFAULT]):
        refused = procs.run(*command, timeout=60)
        expected = 1 if command[0] == "-c" else Exit.AUTH  # -c: a traceback, exit 1
        assert refused.returncode == expected, refused.stderr
        assert (
            f"refusing the runtime directory {local_dir(procs)}: its mode is 755, not "
            f"700 (chmod 700 it)" in refused.stderr
        )
    assert list(local_dir(procs).iterdir()) == []  # no key, lock or socket written there


# ------------------------------------------------------------------------------ --help


def help_examples() -> dict[str, list[str]]:
    """Each command's examples, as its --help prints them (the lines after "example:")."""
    examples = {}
    for name, command in subparsers(build_parser()).items():
        assert command.epilog is not None
        block = command.epilog.split("example:\n", 1)[1].split("\n\n", 1)[0]
        examples[name] = [line.strip() for line in block.splitlines()]
    return examples


def test_every_help_example_parses() -> None:
    for name, lines in help_examples().items():
        assert lines, name
        for line in lines:
            argv = shlex.split(line)
            assert argv[:4] == ["python", "-m", "mpsched", name], line
            args = build_parser().parse_args(argv[3:])  # SystemExit(2) if it does not parse
            assert args.command == name


def test_the_help_examples_that_talk_to_the_local_manager_run_as_written(procs: Processes) -> None:
    examples = help_examples()
    [local_serve] = [e for e in examples["serve"] if e == "python -m mpsched serve"]
    manager = serve(procs, *shlex.split(local_serve)[4:])

    def run(line: str, **replace: str) -> str:
        for old, new in replace.items():
            line = line.replace(old, new)
        return ok(procs, *shlex.split(line)[3:], timeout=120)

    [worker, _remote] = examples["worker"]  # the second one's host is an example address
    pool = procs.start(*shlex.split(worker)[3:])
    assert pool.line() == f"mpsched worker: 2 processes joined {manager.address}"
    [once, nightly] = examples["submit"]
    assert run(once).splitlines()[1] == "2432902008176640000"
    assert run(nightly).splitlines()[0] == "nightly"
    assert [s["id"] for s in json.loads(run(*examples["schedules"]))] == ["nightly"]
    assert json.loads(run(*examples["status"]))["queue"]["completed"] >= 1
    later = ok(procs, "submit", "jobs:noop", "--delay", "3600").strip()
    assert later in run(*examples["jobs"])
    # The ids in the examples stand for a job's: here, jobs the manager has (without a
    # store it keeps no outcome of a finished job: result waits for one still pending).
    placeholder = "3f2a1b4c5d6e-17"
    soon = ok(procs, "submit", "math:factorial", "--args", "[6]", "--delay", "1").strip()
    assert run(*examples["result"], **{placeholder: soon}) == "720\n"
    assert run(*examples["cancel"], **{placeholder: later}) == f"cancelled job {later}\n"
    assert psutil.Process(pool.pid).is_running()
