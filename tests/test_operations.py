"""The deployment examples of docs/operations.md work: the systemd unit's ExecStart and the
Dockerfile's CMD start a manager that answers, and stop on SIGTERM with exit 0.

Paths of the examples are swapped for this test's own, and their ports for free ones. No
image is built: that needs a Docker daemon.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from processes import Lines, Programs

pytestmark = pytest.mark.slow

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
TIMEOUT = 60.0  # seconds for the manager to start, answer and drain


def _block(language: str) -> str:
    match = re.search(rf"^```{language}\n(.*?)^```", OPERATIONS.read_text(), re.S | re.M)
    assert match, f"no {language} block in {OPERATIONS}"
    return match.group(1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _unit_command(tmp_path: Path) -> list[str]:
    [line] = [line for line in _block("ini").splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0].endswith("/bin/python"), argv
    return argv[1:]


def _docker_command() -> list[str]:
    [line] = [line for line in _block("dockerfile").splitlines() if line.startswith("CMD ")]
    argv = json.loads(line.removeprefix("CMD "))
    assert argv[0] == "python", argv
    return argv[1:]


def _localised(argv: list[str], tmp_path: Path) -> tuple[list[str], int]:
    """``argv`` with this test's files and free ports; returns it and the workers' port."""
    port = _free_port()
    key = tmp_path / "key"
    key.write_text("a-key-for-this-test\n")
    key.chmod(0o600)
    swapped = []
    for arg in argv:
        if arg.endswith(":7000"):
            arg = f"127.0.0.1:{port}"
        elif re.fullmatch(r"127\.0\.0\.1:\d+", arg):
            arg = "127.0.0.1:0"
        elif arg.endswith("/key"):
            arg = str(key)
        elif arg.endswith("/jobs.db"):
            arg = str(tmp_path / "jobs.db")
        swapped.append(arg)
    return swapped, port


def _serve_answers_and_drains(
    programs: Programs, argv: list[str], port: int, tmp_path: Path
) -> None:
    popen = programs.start(*argv, env={"XDG_RUNTIME_DIR": str(tmp_path)}, stderr=subprocess.STDOUT)
    assert popen.stdout is not None
    out = Lines(popen.stdout)
    out.until(lambda line: "listening on" in line, TIMEOUT)
    status = programs.run(
        "-m",
        "mpsched",
        "status",
        "--connect",
        f"127.0.0.1:{port}",
        "--authkey-file",
        str(tmp_path / "key"),
        "--json",
        timeout=TIMEOUT,
    )
    assert status.returncode == 0, status.stderr
    assert "queue" in json.loads(status.stdout)
    popen.send_signal(signal.SIGTERM)  # what systemd and docker stop send
    assert popen.wait(TIMEOUT) == 0, out.seen


def test_the_systemd_units_command_serves_and_drains_on_sigterm(
    programs: Programs, tmp_path: Path
) -> None:
    argv, port = _localised(_unit_command(tmp_path), tmp_path)
    _serve_answers_and_drains(programs, argv, port, tmp_path)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = _block("ini").replace("/opt/myjobs/.venv/bin/python", sys.executable)
    unit = unit.replace("/opt/myjobs", str(tmp_path))
    unit = re.sub(r"^(User|Group)=.*$", r"\1=root", unit, flags=re.M)
    path = tmp_path / "mpsched.service"
    path.write_text(unit)
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


def test_the_dockerfiles_command_serves_and_drains_on_sigterm(
    programs: Programs, tmp_path: Path
) -> None:
    argv, port = _localised(_docker_command(), tmp_path)
    _serve_answers_and_drains(programs, argv, port, tmp_path)
