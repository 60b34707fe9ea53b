"""Helpers for tests that watch real processes."""

from __future__ import annotations

import contextlib
import os
import pty
import queue
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import psutil

TESTS_DIR = Path(__file__).resolve().parent


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    """Poll a state the processes under test offer no event for."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.05)


def wait_started(fifo: str) -> list[int]:
    """Block until a job announces itself on ``fifo`` (tests/jobs.py); returns its pids."""
    with open(fifo) as announced:
        return [int(x) for x in announced.read().split()]


def assert_gone(procs: Iterable[int | psutil.Process], timeout: float = 15.0) -> None:
    """Every process exits within ``timeout`` (a zombie awaiting its reaper counts)."""
    watched = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            watched.append(proc if isinstance(proc, psutil.Process) else psutil.Process(proc))
    _, alive = psutil.wait_procs(watched, timeout=timeout)
    running = [p for p in alive if _running(p)]
    assert not running, f"left behind: {running}"


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Programs:
    """Runs user programs in real interpreters, each in its own session (so that
    ``stop_all`` kills it with all it started, whatever state a test left it in).

    A program's ``sys.path`` starts with tests/, so it can import the job modules.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        pythonpath = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": pythonpath}
        self._popens: list[subprocess.Popen[str]] = []
        self._terminals: list[Terminal] = []
        self._descendants: list[psutil.Process] = []

    def start(
        self,
        *args: str,
        stdin: Any = subprocess.DEVNULL,
        stdout: Any = subprocess.PIPE,
        stderr: Any = subprocess.PIPE,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """``python ARGS`` in the work directory (``env``: variables to add or change)."""
        popen = subprocess.Popen(
            [sys.executable, *args],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=True,
            cwd=self.workdir,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )
        self._popens.append(popen)
        return popen

    def interactive(self) -> tuple[subprocess.Popen[str], Terminal]:
        """``python -q`` on a pty: its REPL, and the terminal that types into it. The plain
        REPL on Python 3.13 too (the new one indents typed lines itself, which would
        indent this typing twice), without colours."""
        master, slave = pty.openpty()
        try:
            popen = subprocess.Popen(
                [sys.executable, "-q"],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                text=True,
                cwd=self.workdir,
                env={**self.env, "PYTHON_BASIC_REPL": "1", "PYTHON_COLORS": "0"},
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self._popens.append(popen)
        self._terminals.append(terminal := Terminal(master))
        return popen, terminal

    def run(
        self, *args: str, source: str | None = None, timeout: float = 90.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python ARGS`` to its end, with ``source`` on its stdin."""
        popen = self.start(*args, stdin=subprocess.DEVNULL if source is None else subprocess.PIPE)
        out, err = popen.communicate(source, timeout=timeout)
        return subprocess.CompletedProcess(popen.args, popen.returncode, out, err)

    def script(self, source: str, name: str = "program.py") -> Path:
        """Write a program file in the work directory."""
        path = self.workdir / name
        path.write_text(textwrap.dedent(source))
        return path

    def note_descendants(self, popen: subprocess.Popen[str]) -> list[psutil.Process]:
        """What ``popen`` started, recursively (kept to kill at the end, and returned)."""
        try:
            found = psutil.Process(popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self._descendants.extend(found)
        return found

    def stop_all(self) -> None:
        for popen in self._popens:
            self.note_descendants(popen)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)  # its session: what it started
        for proc in self._descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # psutil checks the pid was not reused
        for popen in self._popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(10)
            for stream in (popen.stdin, popen.stdout, popen.stderr):
                if stream is not None:
                    stream.close()
        for terminal in self._terminals:
            terminal.close()


class Lines:
    """The lines of a process's output stream, read by a daemon thread as they come."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []  # every line read so far, for assertion messages
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in stream:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def next(self, timeout: float = 60.0) -> str:
        """The next line; fails if none comes within ``timeout`` or the stream ends."""
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line in {timeout} s after: {self.seen}") from None
        if line is None:
            self._queue.put(None)
            raise AssertionError(f"the stream ended after: {self.seen}")
        self.seen.append(line)
        return line

    def until(self, predicate: Callable[[str], bool], timeout: float = 60.0) -> str:
        """Skip lines until one satisfies ``predicate`` (within ``timeout`` in all)."""
        deadline = time.monotonic() + timeout
        while not predicate(line := self.next(max(0.0, deadline - time.monotonic()))):
            pass
        return line

    def rest(self, timeout: float = 60.0) -> list[str]:
        """Every line left, once the stream ends (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"the stream did not end in {timeout} s: {self.seen}"
                ) from None
            if line is None:
                self._queue.put(None)
                return self.seen[start:]
            self.seen.append(line)


class Terminal:
    """The master side of a pty that an interactive interpreter reads and writes."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.output = ""  # everything read so far (echoed input and prompts included)
        self._searched = 0  # read_until looks from here: past what it found before

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def read_until(self, text: str, timeout: float = 60.0) -> None:
        """Read until ``text`` was printed after what the last call found."""
        deadline = time.monotonic() + timeout
        while (found := self.output.find(text, self._searched)) < 0:
            assert self._read(deadline), (
                f"not printed in {timeout} s: {text!r}; output: {self.output!r}"
            )
        self._searched = found + len(text)

    def read_to_end(self, timeout: float = 60.0) -> str:
        """Read until the interpreter has exited; returns everything read."""
        deadline = time.monotonic() + timeout
        while self._read(deadline):
            pass
        return self.output

    def _read(self, deadline: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 4096)
        except OSError:  # EIO: every slave end is closed, the interpreter has exited
            return False
        self.output += chunk.decode(errors="replace").replace("\r", "")
        return bool(chunk)

    def close(self) -> None:
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
