"""``python -m mpsched`` in-process: help texts, versions, status text, and what every
command says when the address holds no mpsched manager. No manager is started here."""

from __future__ import annotations

import argparse
import contextlib
import platform
import re
import socket
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import cloudpickle
import pytest

import mpsched
import mpsched._transport.connect as connect
from mpsched import ManagerUnreachableError
from mpsched._cli.formats import format_due, format_duration
from mpsched._cli.main import main
from mpsched._cli.parser import EXIT_MEANINGS, Command, build_parser
from mpsched._cli.status import format_stats
from mpsched._core.job import QueueStats
from mpsched._protocol.records import (
    Exit,
    Stats,
    WorkerStatus,
)
from mpsched._transport.authkey import AUTHKEY_ENV

# ------------------------------------------------------------------------------ help


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_option_of_every_command_has_a_help_text() -> None:
    parser = build_parser()
    commands = subparsers(parser)
    assert tuple(commands) == tuple(Command)
    for name, command in [("", parser), *commands.items()]:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_options_taking_times_or_counts_say_their_unit() -> None:
    commands = subparsers(build_parser())
    units = {
        ("serve", "--max-pending"): "jobs",
        ("serve", "--heartbeat-timeout"): "seconds",
        ("serve", "--max-pending-bytes"): "bytes",
        ("serve", "--drain-timeout"): "seconds",
        ("serve", "--workers"): "processes",
        ("worker", "--processes"): "processes",
        ("worker", "--heartbeat-interval"): "seconds",
        ("submit", "--delay"): "seconds",
        ("submit", "--timeout"): "seconds",
        ("submit", "--retries"): "times",
        ("status", "--json"): "seconds",
        ("stress", "--horizon"): "seconds",
        ("stress", "--jobs"): "jobs",
        ("stress", "--producers"): "processes",
        ("stress", "--workers"): "processes",
    }
    for (command, option), unit in units.items():
        [action] = [a for a in commands[command]._actions if option in a.option_strings]
        assert action.help is not None
        assert unit in action.help.lower(), (command, option, action.help)


def test_version_names_mpsched_python_and_cloudpickle(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.strip() == (
        f"mpsched {mpsched.__version__} (Python "
        f"{platform.python_version()}, cloudpickle "
        f"{cloudpickle.__version__})"
    )


def test_top_level_help_lists_every_exit_code_and_the_key_file_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(EXIT_MEANINGS) == set(Exit)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    listed = dict(re.findall(r"^  (\d+) +(.+)$", out.split("exit codes:")[1], re.MULTILINE))
    assert {int(code) for code in listed} == {int(code) for code in Exit}
    assert "SIGINT" in listed["130"] and "SIGTERM" in listed["143"]
    assert "trailing newline" in out and "chmod 600" in out and AUTHKEY_ENV in out


def test_the_exit_docstring_explains_signal_codes() -> None:
    assert int(Exit.INTERRUPTED) == 130 and int(Exit.TERMINATED) == 143
    assert Exit.__doc__ is not None and "128 +" in Exit.__doc__


@pytest.mark.parametrize(
    ("argv", "command", "error"),
    [
        pytest.param(
            ["submit", "jobs:noop", "--every", "0", "--connect", "unix:/x"],
            "submit",
            "argument --every: must be",
            id="bad-value",
        ),
        pytest.param(
            ["submit", "--delay", "1"],
            "submit",
            "the following arguments are required: target",
            id="missing-argument",
        ),
        pytest.param(
            ["submit", "jobs:noop", "--connect", "unix:/x", "--priority", "urgent"],
            "submit",
            "argument --priority: invalid choice",
            id="bad-choice",
        ),
        pytest.param(
            ["status", "--connect", "unix:/x", "--bogus"],
            "status",
            "unrecognized arguments: --bogus",
            id="unknown-option",
        ),
        pytest.param(
            ["serve", "--workers", "-1"],
            "serve",
            "argument --workers: must be 0",
            id="serve-negative-workers",
        ),
        pytest.param(
            ["no-such-command"], None, "argument COMMAND: invalid choice", id="unknown-command"
        ),
        pytest.param(
            ["submit", "operator:add", "1", "x", "--connect", "unix:/x"],
            "submit",
            "unrecognized arguments: 1 x (the function's arguments go in --args as a "
            """JSON list: --args '[1, "x"]')""",
            id="arguments-after-the-target",
        ),
    ],
)
def test_a_command_line_argparse_refuses_is_one_line_and_a_pointer_to_help(
    argv: list[str], command: str | None, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == Exit.USAGE
    err = capsys.readouterr().err
    help_of = f"python -m mpsched{f' {command}' if command else ''} --help"
    assert err.startswith(f"mpsched: {error}") and err.endswith(f"; see {help_of}\n"), err
    assert err.count("\n") == 1 and "usage:" not in err, err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        pytest.param(
            ["submit", "no_such_module:f"], "cannot import no_such_module:f", id="unimportable"
        ),
        pytest.param(
            ["submit", "math:factorial", "--args", "[20"], "--args is not JSON", id="args-not-json"
        ),
        pytest.param(
            ["submit", "math:factorial", "--every", "5", "--wait"],
            "--wait cannot wait for a schedule",
            id="recurring-wait",
        ),
    ],
)
def test_a_command_line_a_command_refuses_is_one_line_and_a_pointer_to_help(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--connect", "unix:/nowhere"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"mpsched: {error}"), err
    assert err.endswith("; see python -m mpsched submit --help\n") and err.count("\n") == 1


def test_options_of_seconds_say_what_they_want_in_the_same_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    said = []
    for argv in (
        ["worker", "--heartbeat-interval", "0"],
        ["worker", "--heartbeat-interval", "-1"],
        ["serve", "--drain-timeout", "-1"],
        ["serve", "--drain-timeout", "soon"],
    ):
        with pytest.raises(SystemExit):
            main([*argv, "--connect", "unix:/x"] if argv[0] == "worker" else argv)
        said.append(capsys.readouterr().err.split(": ", 2)[2].split(";")[0])
    assert said == [
        "must be a finite number of seconds > 0, not 0",
        "must be a finite number of seconds > 0, not -1",
        "must be a finite number of seconds >= 0, not -1",
        "must be a finite number of seconds >= 0, not soon",
    ]


# ------------------------------------------------------------------------------ status text


def stats(next_due_in: float | None) -> Stats:
    queue = QueueStats(
        pending={"high": 1, "medium": 0, "low": 0},
        in_flight=0,
        submitted=1,
        completed=0,
        failed=0,
        cancelled=0,
        retried=0,
        timed_out=0,
        started_early=0,
        next_due_in=next_due_in,
        lateness={"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0},
        lateness_samples=0,
        wakeups=0,
        waiting=0,
    )
    worker = WorkerStatus("w1", 42, "host", False, 0, None, 0.0, 2**20)
    return Stats(queue, (worker,), uptime=7300.0, throughput=0.0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0.35, "350 ms", id="ms"),
        pytest.param(1.24, "1.2 s", id="s"),
        pytest.param(245, "4 min 05 s", id="min"),
        pytest.param(3 * 3600 + 125, "3 h 02 min", id="h"),
        pytest.param(12 * 86400 + 4 * 3600 + 59, "12 d 04 h", id="d"),
        pytest.param(1e300, "more than 100 years", id="far"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_status_shows_the_next_due_job_as_a_wait_and_a_local_time() -> None:
    now = datetime(2026, 12, 3, 9, 0, 0).timestamp()
    due = format_due(3 * 3600 + 125, now)
    assert due.startswith("due in 3 h 02 min (2026-12-03T12:02:05")
    assert datetime.fromisoformat(due[due.index("(") + 1 : -1]).timestamp() == now + 3 * 3600 + 125
    assert format_due(-1.23, now).startswith("overdue by 1.2 s (2026-12-03T08:59:58")
    assert format_due(None, now) == "-"

    text = format_stats(stats(3 * 3600 + 125), "unix:/run/m.sock", now)
    assert "next job due in 3 h 02 min (2026-12-03T12:02:05" in text
    assert "up 2 h 01 min" in text


def test_status_of_a_job_past_the_year_9999_prints_no_huge_number() -> None:
    text = format_stats(stats(1e300), "unix:/run/m.sock", datetime(2026, 1, 1).timestamp())
    assert "next job due in more than 100 years\n" in text
    assert not re.search(r"\d{12}", text), text


# ------------------------------------------------------------------------------ no manager


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_bytes(b"secret\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def refused_port() -> int:
    """A TCP port on loopback that nothing listens on (it was free a moment ago)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def chatty_server() -> Iterator[str]:
    """A TCP server that answers every connection with an HTTP error, as a web server
    would, and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    with contextlib.suppress(OSError):
        socket.create_connection(listener.getsockname(), timeout=5).close()  # wake accept()
    thread.join(10)
    listener.close()


@pytest.fixture
def silent_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A TCP server that accepts connections (in its backlog) and never says a word."""
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def command_line(command: str, address: str, key_file: Path) -> list[str]:
    extra = {
        "submit": ["math:factorial", "--args", "[3]", "--wait"],
        "worker": ["--processes", "1"],
        "stress": ["--jobs", "10"],
    }.get(command, [])
    return [command, *extra, "--connect", address, "--authkey-file", str(key_file)]


@pytest.mark.parametrize("command", ["status", "worker", "submit", "stress"])
def test_every_client_command_says_what_is_at_a_wrong_address(
    command: str,
    key_file: Path,
    tmp_path: Path,
    refused_port: int,
    chatty_server: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = {
        "nohost.invalid:7000": "unknown host nohost.invalid",
        f"127.0.0.1:{refused_port}": "nothing is listening there",
        f"unix:{tmp_path}/none.sock": "nothing is listening there (no such socket file)",
        chatty_server: "what listens there is not an mpsched manager",
    }
    for address, reason in cases.items():
        assert main(command_line(command, address, key_file)) == Exit.UNREACHABLE, address
        err = capsys.readouterr().err
        assert err.startswith(f"mpsched: no manager answers at {address}: "), err
        assert reason in err and err.count("\n") == 1, err


def test_a_silent_server_is_not_a_manager(
    key_file: Path, silent_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(command_line("status", silent_server, key_file)) == Exit.UNREACHABLE
    err = capsys.readouterr().err
    # A TCP server that stays silent may also be a manager serving TLS: said too.
    assert err == (
        f"mpsched: no manager answers at {silent_server}: what listens there is "
        f"not an mpsched manager (it sent no handshake in time; if it serves TLS, "
        f"connect with --tls-ca)\n"
    )


def test_connect_raises_a_connection_error_saying_what_is_there(
    tmp_path: Path, refused_port: int, chatty_server: str, silent_server: str
) -> None:
    for address, reason in [
        ("nohost.invalid:7000", "unknown host"),
        (f"127.0.0.1:{refused_port}", "nothing is listening there"),
        (str(tmp_path / "none.sock"), "no such socket file"),
        (chatty_server, "not an mpsched manager (it sent something else"),
        (
            silent_server,
            "not an mpsched manager (it sent no handshake in time; if it "
            "serves TLS, connect with --tls-ca)",
        ),
    ]:
        with pytest.raises(ManagerUnreachableError) as caught:
            mpsched.connect(address, authkey=b"secret")
        assert isinstance(caught.value, ConnectionError)
        assert reason in str(caught.value), (address, str(caught.value))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        pytest.param(
            socket.gaierror(-2, "Name or service not known"), "unknown host db1", id="gaierror"
        ),
        pytest.param(
            ConnectionRefusedError(111, "Connection refused"), "nothing is listening", id="refused"
        ),
        pytest.param(PermissionError(13, "Permission denied"), "no permission", id="permission"),
        pytest.param(OSError(113, "No route to host"), "cannot reach the host", id="no-route"),
        pytest.param(
            BlockingIOError(11, "Resource temporarily unavailable"), "no handshake", id="silent"
        ),
        pytest.param(EOFError(), "hung up", id="eof"),
        pytest.param(ConnectionResetError(104, "reset"), "hung up", id="reset"),
        pytest.param(
            ConnectionResetError("closed during the handshake (does it require TLS?)"),
            "hung up during the handshake; if it serves TLS, connect with --tls-ca",
            id="reset-by-a-tls-server",
        ),
        pytest.param(AssertionError("message = b'hello'"), "sent something else", id="garbage"),
    ],
)
def test_unreachable_reasons(error: BaseException, reason: str) -> None:
    unreachable = ManagerUnreachableError.from_error("db1:7000", error)
    assert str(unreachable).startswith("no manager answers at db1:7000: ")
    assert reason in unreachable.reason


def test_a_wrong_address_is_still_a_usage_error(
    key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--connect", "nowhere", "--authkey-file", str(key_file)]) == Exit.USAGE
    assert "HOST:PORT" in capsys.readouterr().err
