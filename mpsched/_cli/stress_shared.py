"""The stress run on a shared store: several managers on one Redis, killed and restarted.

``run_shared_stress`` starts ``managers`` ``serve`` processes on one Redis store (each on
a Unix socket of the run's own, with ``workers`` local workers and a short lease), then
producer processes that connect to them in turn and submit the jobs (stress_producers.produce).
While they run, a manager is SIGKILLed with its workers every ``kill_every`` seconds and
started again at the same address: its clients reconnect and re-attach their futures by
id, its pending jobs wait in Redis, and the jobs it ran are taken back by its peers once
its lease runs out. The run log (one line per run) is then checked::

    producers ──▶ manager 0 ─┐                 ┌──▶ stress.log
              ──▶ manager 1 ─┼── Redis queue ──┤     (key per run)
              ──▶ manager 2 ─┘   (killed ...)  └──▶ futures

Every key ran exactly once and returned, or (its manager was killed while it ran) ran at
most once and failed with WorkerCrashedError; none ran twice, none was lost, none started
early. Jobs are submitted with retries=0, so a second run of a key is always a fault.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, TextIO

from mpsched._cli.formats import plural
from mpsched._cli.stress_producers import (
    RESULT_MARGIN,
    ProducerSpec,
    record,
    report_of,
    run_producers,
)
from mpsched._cli.stress_report import (
    ProducerFailed,
    ProducerReport,
    StressReport,
    collect,
    job_keys,
    print_report,
    verify,
)
from mpsched._client.client import Client, connect
from mpsched._core.job import Priority
from mpsched._errors import (
    ManagerConnectionLostError,
    ManagerUnreachableError,
    WorkerCrashedError,
)
from mpsched._store.redis.url import shown_store
from mpsched._transport.address import parse_address

START_TIMEOUT = 60.0  # longest a manager may take to print that it listens


class Managers:
    """``serve`` processes on one store, each at a fixed Unix socket, in sessions of their
    own (a SIGKILL of the group takes its workers too)."""

    def __init__(
        self, store: str, count: int, workers: int, lease_timeout: float, tmp: str
    ) -> None:
        self._store = store
        self._workers = workers
        self._lease = lease_timeout
        self.key_file = Path(tmp) / "authkey"
        self.key_file.write_text(secrets.token_hex(32))
        self.key_file.chmod(0o600)
        self.addresses = [f"unix:{tmp}/m{n}.sock" for n in range(count)]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self._logs = [Path(tmp) / f"m{n}.log" for n in range(count)]
        for n in range(count):
            self.start(n)

    def start(self, n: int) -> None:
        """Start manager ``n`` and wait until it listens."""
        command = [
            sys.executable,
            "-m",
            "mpsched",
            "serve",
            "--address",
            self.addresses[n],
            "--authkey-file",
            str(self.key_file),
            "--workers",
            str(self._workers),
            "--store",
            self._store,
            "--lease-timeout",
            str(self._lease),
        ]
        with open(self._logs[n], "ab") as log:
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs[n] = proc
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "mpsched manager listening on ..."
        if b"listening" not in line:
            proc.stdout.close()  # stop() ends the process
            raise RuntimeError(f"manager {n} did not start: {self._logs[n].read_text()[-2000:]}")
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()

    def kill(self, n: int) -> None:
        """SIGKILL manager ``n`` with everything it started."""
        proc = self._procs[n]
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def stop(self) -> None:
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for n, proc in enumerate(self._procs):
            if proc is None:
                continue
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(n)


def _drain(stream: IO[bytes]) -> None:
    """Read what a manager prints after its first line, then close the pipe: its end of
    it closes once the manager and the workers of its session are gone."""
    with stream:
        stream.read()


def run_shared_stress(
    *,
    store: str,
    managers: int,
    producers: int,
    workers: int,
    jobs: int,
    horizon: float,
    kill_every: float | None,
    lease_timeout: float = 2.0,
    out: TextIO,
) -> int:
    """Flood ``managers`` managers of one Redis store, killing one now and then; check
    that every job ran once (see the module docstring). Returns 0 when every check
    passed, 1 otherwise."""
    begun = time.monotonic()
    report = StressReport(jobs=jobs, producers=producers, workers=workers * managers)
    killed = 0
    with tempfile.TemporaryDirectory(prefix="mpsched-stress-") as tmp:
        log_path = os.path.join(tmp, "stress.log")
        running = Managers(store, managers, workers, lease_timeout, tmp)
        stop = threading.Event()

        def killer() -> None:
            nonlocal killed
            rng = random.Random()
            while kill_every and not stop.wait(kill_every):
                n = rng.randrange(managers)
                running.kill(n)
                killed += 1
                running.start(n)

        thread = threading.Thread(target=killer, daemon=True)
        try:
            thread.start()
            addresses = [parse_address(a) for a in running.addresses]
            replies = run_producers(
                report,
                addresses,
                running.key_file.read_bytes().strip(),
                log_path,
                horizon,
                target=produce_shared,
            )
            stop.set()
            thread.join(START_TIMEOUT)
        finally:
            stop.set()
            running.stop()
        collect(report, replies)
        crashed = {k for r in replies if isinstance(r, ProducerReport) for k in r.crashed}
        verify(report, log_path, crashed)
    report.elapsed = time.monotonic() - begun
    print(
        f"managers:    {managers} on {shown_store(store)}, {plural(killed, 'kill')} "
        f"(each restarted at once)",
        file=out,
    )
    print_report(report, out)
    return 0 if report.ok else 1


def _connect(spec: ProducerSpec) -> Client:
    """A client of the producer's manager, which may be being restarted just then."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            return connect(spec.address, authkey=spec.authkey)
        except ManagerUnreachableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def produce_shared(spec: ProducerSpec, link: Connection) -> None:
    """A producer process of a shared-store run (as stress_producers.produce, but its manager may
    be killed under it: a submit refused during the outage is made again, and a job that
    failed because its manager died as it ran is reported as crashed)."""
    try:
        reply: ProducerReport | ProducerFailed = _produce_shared(spec, link)
    except Exception as exc:
        reply = ProducerFailed(spec.producer, repr(exc))
    with contextlib.suppress(OSError):
        link.send(reply)


def _produce_shared(spec: ProducerSpec, link: Connection) -> ProducerReport:
    rng = random.Random()
    client = _connect(spec)
    try:
        link.send("ready")
        link.recv()
        first_submit = time.monotonic()
        submitted = []
        for key in job_keys(spec.producer, spec.count):
            delay = rng.uniform(0.0, spec.horizon)
            while True:
                earliest = time.monotonic() + delay
                try:
                    future = client.schedule(
                        record, spec.log_path, key, delay=delay, priority=rng.choice(list(Priority))
                    )
                    break
                except ManagerConnectionLostError:  # nothing was sent: again once it is back
                    time.sleep(0.05)
            submitted.append((key, earliest, future))
        concurrent.futures.wait([f for _, _, f in submitted], timeout=spec.horizon + RESULT_MARGIN)
        crashed = tuple(
            key
            for key, _, f in submitted
            if f.done() and not f.cancelled() and isinstance(f.exception(), WorkerCrashedError)
        )
        return dataclasses.replace(
            report_of(spec.producer, submitted, first_submit), crashed=crashed
        )
    finally:
        client.shutdown(wait=False, cancel_futures=True)
