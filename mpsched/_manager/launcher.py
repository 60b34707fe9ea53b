"""A Scheduler's manager process: a fresh interpreter that never imports the owner's main.

multiprocessing's spawn and forkserver children first re-run the parent's main module
(``spawn.prepare``: ``init_main_from_path``/``init_main_from_name``), so that functions
pickled by reference to ``__main__`` resolve. Neither the manager nor its workers need it:
jobs travel by value (cloudpickle), and the manager never unpickles them. Re-running it
breaks every program that is not under ``if __name__ == "__main__":`` (the child starts a
Scheduler of its own while bootstrapping), and every ``__main__`` without a file (``python
-``, a REPL, a notebook). So the manager is started as ``python -c BOOT``: its own
``__main__`` is empty, the workers it starts (with the chosen start method) inherit that,
and nothing re-runs the program. Its sys.path and sys.argv are the owner's (as
multiprocessing would pass them), sent before mpsched is imported there.

The control connection is one end of a socket pair that only the owner holds: the
manager reads its config from it, answers ManagerReady or ManagerFailed, and stops when
told, or at once when the connection closes (the owner died, even by SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.process
import multiprocessing.spawn
import multiprocessing.util
import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection, wait

from mpsched._errors import MpschedError
from mpsched._payload import shm
from mpsched._protocol.records import (
    STOP,
    STOP_NOW,
    ManagerConfig,
    ManagerFailed,
    ManagerReady,
)

log = logging.getLogger("mpsched.scheduler")

# What the manager's interpreter runs. SIGINT is ignored before anything else: a
# terminal's Ctrl-C reaches the whole process group, and the owner decides when its
# manager stops. sys.path comes first over the pipe: the owner may have found mpsched
# (and its jobs' modules) on a path of its own. run_owned has closed what it opened when it
# returns; then multiprocessing's exit work runs (its temporary directory goes, as from a
# multiprocessing child) and the exit skips the rest of the interpreter's teardown, as a
# forkserver child's does (30 ms of a Scheduler's shutdown otherwise).
BOOT = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "control = Connection({fd})\n"
    "sys.path[:], sys.argv[:] = control.recv()\n"
    "from {module} import {name} as run_owned\n"
    "code = run_owned(control)\n"
    "import logging, multiprocessing.util, os\n"
    "multiprocessing.util._exit_function(); logging.shutdown()\n"
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)\n"
)

# What BOOT runs, as (module, name): mpsched._manager.main.run_owned, or a wrapper of it that a
# profiler names (benchmarks/profile_recurring.py puts probes in the manager).
ENTRY = ("mpsched._manager.main", "run_owned")

REIMPORT_HINT = (
    "Scheduler() not started: multiprocessing re-runs the main module in this child "
    "process, which the program started with spawn or forkserver (a Process, Pool or "
    "ProcessPoolExecutor of its own); put the top-level code under "
    '`if __name__ == "__main__":` so that its children do not each start a Scheduler'
)


class ManagerProcess:
    """The manager's interpreter, with the names of ``multiprocessing.Process`` that its
    owner uses (``pid``, ``join``, ``is_alive``, ``exitcode``, ``terminate``, ``kill``),
    and its control connection: :meth:`wait_ready`, :meth:`stop`, :meth:`stop_now`."""

    def __init__(self, config: ManagerConfig) -> None:
        """Start the manager; ``control`` is then the owner's end of its control pipe.

        Raises:
            SystemExit: (after logging REIMPORT_HINT, one line) called while
                multiprocessing re-runs the main module in a child process: the program's
                own start method chose that re-import, and the child cannot go on (where
                multiprocessing would raise a RuntimeError, a 40-line traceback).
            OSError: the interpreter could not be started.
        """
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            log.error("%s", REIMPORT_HINT)
            raise SystemExit(1)
        ours, theirs = socket.socketpair()
        with ours, theirs:
            fd = theirs.fileno()
            # The owner's interpreter and flags (-X, -W, -O ...), as multiprocessing's own.
            flags = multiprocessing.util._args_from_interpreter_flags()  # type: ignore[attr-defined]
            command = [
                multiprocessing.spawn.get_executable(),
                *flags,
                "-c",
                BOOT.format(fd=fd, module=ENTRY[0], name=ENTRY[1]),
            ]
            # Not a multiprocessing child: stdin is never the manager's (with ``python -``
            # it is the program's source), as multiprocessing closes it in its children.
            self._popen = subprocess.Popen(command, pass_fds=(fd,), stdin=subprocess.DEVNULL)
            self.control = Connection(ours.detach())
        self.pid: int = self._popen.pid
        # The manager's shared-memory segments, removed by stop() if it died without
        # removing them ("": none known).
        self._segment_prefix = ""
        # Readable once the process has exited (Linux 5.3+): join() waits on it, where
        # Popen.wait(timeout) would poll with sleeps of up to 50 ms.
        self._exited: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._exited = os.pidfd_open(self.pid)
        try:
            self.control.send((_owner_path(), list(sys.argv)))
            self.control.send(config)
        except OSError:  # died at once; the owner reads EOF and reports the exit code
            pass

    def wait_ready(self, timeout: float) -> ManagerReady:
        """Wait for the manager to listen with its workers joined.

        Raises:
            MpschedError: it did not start within ``timeout`` seconds, or exited, or
                failed to start (the reason said); the error it sent, if any, as itself
                (a StoreError, say).
        """
        if not self.control.poll(timeout):
            raise MpschedError(f"the mpsched manager did not start within {timeout} s")
        try:
            message = self.control.recv()
        except EOFError:
            self.join(5.0)
            raise MpschedError(
                f"the mpsched manager exited during start-up (exit code {self.exitcode})"
            ) from None
        if isinstance(message, ManagerFailed):
            if message.error is not None:
                raise message.error
            raise MpschedError(f"the mpsched manager failed to start: {message.reason}")
        assert isinstance(message, ManagerReady)
        return message

    def sweep_on_stop(self, prefix: str) -> None:
        """The manager names its shared-memory segments ``prefix...``: if it dies without
        removing them, :meth:`stop` does."""
        self._segment_prefix = prefix

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the manager to stop, wait for it, and make sure it is gone (and, if it could
        not remove its shared-memory segments, remove them: :meth:`sweep_on_stop`)."""
        with contextlib.suppress(OSError):
            self.control.send(STOP)
        self.join(timeout)
        if self.is_alive():
            log.warning(
                "the mpsched manager (pid %s) did not stop in %.0f s; terminating",
                self.pid,
                timeout,
            )
            self.terminate()
            self.join(2.0)
        if self.is_alive():
            self.kill()
            self.join(2.0)
        self.control.close()
        if self._segment_prefix and not self.is_alive():
            shm.sweep(self._segment_prefix)

    def stop_now(self) -> None:
        """Tell the manager to stop at once: its workers are killed with their jobs."""
        with contextlib.suppress(OSError):
            self.control.send(STOP_NOW)

    @property
    def exitcode(self) -> int | None:
        """As ``Process.exitcode``: None while running, -N if killed by signal N."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        if self._exited is not None and self._popen.poll() is None:
            wait([self._exited], timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(0 if self._exited is not None else timeout)
        if self._popen.returncode is not None and self._exited is not None:
            os.close(self._exited)
            self._exited = None

    def terminate(self) -> None:
        self._popen.terminate()  # a no-op once it has been reaped: never another pid

    def kill(self) -> None:
        self._popen.kill()


def _owner_path() -> list[str]:
    """This process's sys.path as multiprocessing passes it to a child: "" (the current
    directory) stands for the directory the program started in."""
    original = multiprocessing.process.ORIGINAL_DIR  # type: ignore[attr-defined]
    return [original if entry == "" and original else entry for entry in sys.path]
