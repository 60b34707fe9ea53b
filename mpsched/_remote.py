"""``python -m mpsched worker --connect``: a pool of remote worker processes.

The parent starts ``processes`` workers, restarts one that crashed or killed itself for a
job timeout, and stops them all on a fatal start-up error (wrong key, version mismatch,
no manager). First SIGTERM or SIGINT: every worker drains (finishes its job, takes no
more) and the pool exits 0. Second: the workers are killed.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mpsched._errors import AuthenticationError, VersionMismatchError
from mpsched._protocol import Exit
from mpsched._transport import host_name
from mpsched._worker import WorkerConfig, remote_worker_main

log = logging.getLogger("mpsched.remote")


def _child(config: WorkerConfig, lifeline: Connection) -> None:
    config = replace(config, worker_id=f"{host_name()}:{os.getpid()}")
    try:
        code = remote_worker_main(config, lifeline)
    except AuthenticationError as exc:
        print(f"mpsched worker: {exc}", file=sys.stderr)
        code = Exit.AUTH
    except VersionMismatchError as exc:
        print(f"mpsched worker: refused: {exc}", file=sys.stderr)
        code = Exit.VERSION
    except (ConnectionError, FileNotFoundError, EOFError) as exc:
        print(f"mpsched worker: no manager at the address: {exc}", file=sys.stderr)
        code = Exit.UNREACHABLE
    sys.exit(int(code))


class WorkerPool:
    """The parent of ``processes`` remote worker processes."""

    def __init__(self, config: WorkerConfig, processes: int, method: str) -> None:
        self._config = config
        self._processes = processes
        self._ctx: Any = multiprocessing.get_context(method)
        # Children exit when this process dies: only it holds the write end.
        self._lifeline_r, self._lifeline_w = self._ctx.Pipe(duplex=False)
        self._procs: list[BaseProcess] = []  # touched by the main thread only
        self._signals = 0
        self._killed_by = 0  # the signal that made us kill the workers (the second one)

    def run(self) -> int:
        """Run until every worker has left; returns the pool's exit code."""
        fatal = {Exit.AUTH, Exit.VERSION, Exit.UNREACHABLE}
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for _ in range(self._processes):
            self._start()
        result = Exit.OK
        while self._procs:
            ready = wait([p.sentinel for p in self._procs])
            for proc in [p for p in self._procs if p.sentinel in ready]:
                proc.join()
                self._procs.remove(proc)
                code = proc.exitcode
                if code in fatal:
                    result = Exit(code)
                    self._signal_all(signal.SIGTERM)
                elif code != 0 and not self._signals and result == Exit.OK:
                    log.warning("worker pid %s exited with %s; starting another", proc.pid,
                                code)
                    self._start()
        self._lifeline_w.close()
        if self._killed_by:
            return 128 + self._killed_by  # as a process killed by that signal would
        return int(result)

    def _start(self) -> None:
        proc = self._ctx.Process(target=_child, args=(self._config, self._lifeline_r),
                                 name="mpsched-remote-worker")
        proc.start()
        self._procs.append(proc)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals == 1:
            log.warning("received %s: draining workers", signal.Signals(signum).name)
            self._signal_all(signal.SIGTERM)
        else:
            self._killed_by = signum
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, signum: int) -> None:
        for proc in self._procs:
            if proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)
