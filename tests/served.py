"""Real ``python -m mpsched`` processes for end-to-end tests: start them, read what they
print, and kill every one of them (with all they started) when a test ends.

Every process is started in its own session, so a finalizer can kill it together with all
it started (forkserver, workers) by its process group, even when a test fails halfway.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    Stats,
    WorkerStatus,
)
from mpsched._transport.address import parse_address
from mpsched._transport.authkey import AUTHKEY_ENV

TESTS_DIR = Path(__file__).parent  # the helpers (jobs.py, ...) workers import
START_TIMEOUT = 60.0  # a process printing its first line, on a loaded 2-core machine
EXIT_TIMEOUT = 30.0
LISTENING = re.compile(r"listening on (\S+) \(pid (\d+), \d+ local workers?, key (\S+)\)$")


# ------------------------------------------------------------------------------ processes


class Proc:
    """One started ``python -m mpsched`` process; a thread queues its stdout lines."""

    def __init__(self, popen: subprocess.Popen[str], stderr_path: Path) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._stderr_path = stderr_path
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.popen.stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, timeout: float = START_TIMEOUT) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"pid {self.pid} printed nothing in {timeout} s; stderr:\n{self.stderr()}"
            ) from None
        if line is None:
            self._lines.put(None)
            raise AssertionError(
                f"pid {self.pid} exited ({self.popen.poll()}) before printing; "
                f"stderr:\n{self.stderr()}"
            )
        return line

    def wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"pid {self.pid} still running after {timeout} s; stderr:\n{self.stderr()}"
            ) from None

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []


class Processes:
    """Starts mpsched subprocesses and kills every one of them (and their process groups)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        # Short: a Unix socket path must fit in 108 bytes.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="mps-"))
        pythonpath = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
        self.env = {
            **os.environ,
            "PYTHONPATH": pythonpath,
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
        }
        self.env.pop(AUTHKEY_ENV, None)
        self._popens: list[subprocess.Popen[str]] = []
        self.proxies: list[ServiceProxy] = []  # of the managers started, to discard at the end
        self._descendants: list[psutil.Process] = []  # noted while running, for orphans
        self._count = 0

    def _popen(
        self, args: tuple[str, ...], env: dict[str, str] | None, stdout: Any, stderr: Any
    ) -> subprocess.Popen[str]:
        argv = (
            [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", "mpsched", *args]
        )
        popen = subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )
        self._popens.append(popen)
        return popen

    def start(self, *args: str, env: dict[str, str] | None = None) -> Proc:
        """Start a long-running process (serve, worker, a client)."""
        self._count += 1
        stderr_path = self.workdir / f"stderr-{self._count}-{args[0].strip('-')}.txt"
        with open(stderr_path, "w") as stderr:
            popen = self._popen(args, env, subprocess.PIPE, stderr)
        return Proc(popen, stderr_path)

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command (submit, status) to completion."""
        popen = self._popen(args, env, subprocess.PIPE, subprocess.PIPE)
        out, err = popen.communicate(timeout=timeout)
        return subprocess.CompletedProcess(popen.args, popen.returncode, out, err)

    def note_descendants(self, proc: Proc) -> list[psutil.Process]:
        found = proc.descendants()
        self._descendants.extend(found)
        return found

    def stop_all(self) -> None:
        for proxy in self.proxies:
            proxy.discard()
        for popen in self._popens:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._descendants.extend(psutil.Process(popen.pid).children(recursive=True))
        for popen in self._popens:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)  # its session: what it started
        for proc in self._descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # psutil checks the pid was not reused
        for popen in self._popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
            for pipe in (popen.stdout, popen.stderr):  # run()'s stderr too, if it timed out
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ a cluster


@dataclass
class Manager:
    """A ``serve`` process, from the lines it printed."""

    proc: Proc
    address: str  # as printed: "127.0.0.1:4242" or "unix:/..."
    key_file: Path
    # The proxies service() made, discarded (their connections closed) by stop_all().
    proxies: list[ServiceProxy] = field(default_factory=list)

    @property
    def key(self) -> bytes:
        return self.key_file.read_bytes().strip()

    def cli(self, key_file: Path | None = None) -> list[str]:
        return ["--connect", self.address, "--authkey-file", str(key_file or self.key_file)]

    def service(self) -> ServiceProxy:
        self.proxies.append(connect_service(parse_address(self.address), self.key))
        return self.proxies[-1]

    def stats(self) -> Stats:
        service = connect_service(parse_address(self.address), self.key)
        try:
            return service.stats()
        finally:
            service.discard()  # closes its connections now, not at collection

    def remote_workers(self) -> list[WorkerStatus]:
        return [w for w in self.stats().workers if w.remote]


def serve(
    procs: Processes, *args: str, env: dict[str, str] | None = None, code: str | None = None
) -> Manager:
    """Start ``serve`` with ``args``; with ``code``, as ``python -c code`` instead of
    ``python -m mpsched serve``, the code running serve with ``sys.argv[1:]``."""
    proc = procs.start("-c", code, *args, env=env) if code else procs.start("serve", *args, env=env)
    first = proc.line()
    listening = LISTENING.search(first)
    assert listening, first
    assert int(listening.group(2)) == proc.pid, first
    join = proc.line()
    assert join.startswith("  join:   python -m mpsched worker"), join
    return Manager(proc, listening.group(1), Path(listening.group(3)), procs.proxies)


def start_pool(procs: Processes, manager: Manager, processes: int = 1) -> Proc:
    pool = procs.start(
        "worker", *manager.cli(), "--processes", str(processes), "--heartbeat-interval", "0.5"
    )
    assert f"{processes} process{'es' if processes > 1 else ''} joined" in pool.line()
    return pool


def pool_workers(manager: Manager, pool: Proc) -> list[WorkerStatus]:
    mine = {p.pid for p in pool.descendants()}
    return [w for w in manager.remote_workers() if w.pid in mine]
