"""Chaos on a Redis store: 3 managers, 5,000 jobs, and every fault at once in one run.

A redis-server of the run's own (loopback TCP, ``appendonly yes``, ``appendfsync
always``) and 3 ``serve --store redis://... --workers 2 --lease-timeout 3`` managers, each
at a Unix socket of the run's own with one client in this process. The clients submit
5,000 jobs over 40 s (60% due now, 30% delayed 0.5-5 s, 10% with ``retries=1``); each
job appends a start line and an end line to one log (O_APPEND). Meanwhile (T0 = the
first submit):

- T0+6 s: a manager is SIGKILLed with its workers, and started again at its address 3 s
  later (its client reconnects);
- T0+12 s: another manager is SIGSTOPped for 6 s, twice its lease;
- T0+22 s: Redis is SIGKILLed, and started again 2 s later on the same port and data;
- T0+30 s: Redis is SIGSTOPped for 15 s, past the managers' 10 s operation timeout.

Then it reads the log, the futures and the store's listing, and reports: lost (a job the
store took, listed neither done nor failed, or never started), run twice with
``retries=0``, started early (before its submit began plus its delay), false outcomes (a
job whose function wrote its end line but that is listed failed),
futures unresolved 10 s after the last fault, and the seconds from Redis answering again
to the first job started (after the restart, and after the pause). A job that ran to its
end under a manager paused past its lease is listed with that end, but its future may
have failed already with WorkerCrashedError (its peer failed it before the end came):
those are counted apart.

Run: ``.venv/bin/python -m benchmarks.chaos_redis`` (about a minute). Not run by run.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LEASE = 3.0
SETTLE = 10.0  # seconds after the last fault by which every future must have resolved


def chaos_job(log: str, key: str, hold: float) -> str:
    """The job: a start line, ``hold`` seconds, an end line (each one O_APPEND write)."""
    _line(log, f"S {key} {time.time()!r} {os.getpid()}\n")
    time.sleep(hold)
    _line(log, f"E {key} {time.time()!r} {os.getpid()}\n")
    return key


def _line(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Redis:
    """A redis-server of the run's own that can be killed, restarted and paused."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "redis"
        self.dir.mkdir()
        with contextlib.closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0?prefix=chaos"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> float:
        """Start it and wait until it answers; returns when it first did (time.time())."""
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--logfile",
                str(self.dir / "log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self.wait_answers()

    def wait_answers(self) -> float:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError, OSError):
                    if client.ping():
                        persistence = client.info("persistence")
                        # redis-py 5 (the one arq allows) types even a sync
                        # client's reply Awaitable[Any] | Any.
                        assert isinstance(persistence, dict)
                        if not int(persistence["loading"]):
                            return time.time()
                time.sleep(0.005)
        finally:
            client.close()
        raise SystemExit("redis-server did not answer")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


class Managers:
    """``serve`` processes at fixed Unix sockets, one authkey, in sessions of their own."""

    def __init__(self, url: str, count: int, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.key_file = tmp / "authkey"
        self.key_file.write_text(secrets.token_hex(32))
        self.key_file.chmod(0o600)
        self.addresses = [f"unix:{tmp}/m{n}.sock" for n in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for n in range(count):
            self.procs.append(self._start(n))

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        with open(self.tmp / f"m{n}.log", "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mpsched",
                    "serve",
                    "--address",
                    self.addresses[n],
                    "--authkey-file",
                    str(self.key_file),
                    "--workers",
                    "2",
                    "--store",
                    self.url,
                    "--lease-timeout",
                    str(LEASE),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        assert proc.stdout is not None
        if b"listening" not in proc.stdout.readline():
            raise SystemExit(f"manager {n} did not start: see {self.tmp}/m{n}.log")
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        return proc

    def restart(self, n: int) -> None:
        self.procs[n] = self._start(n)

    def kill(self, n: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[n].pid, signal.SIGKILL)
        self.procs[n].wait(30)

    def signal(self, n: int, sig: int) -> None:
        os.kill(self.procs[n].pid, sig)  # the manager only: its workers run on

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(30)


@dataclass
class Submitted:
    """One job as its client sent it."""

    key: str
    began: float  # time.time() as the submit call began
    delay: float
    retries: int
    future: Any = None
    refused: str = ""  # the error the submit raised, if it raised


@dataclass
class Run:
    """What the run saw."""

    jobs: list[Submitted] = field(default_factory=list)
    faults: dict[str, float] = field(default_factory=dict)  # name -> time.time()
    answered: dict[str, float] = field(default_factory=dict)  # Redis answers again
    unresolved_at_settle: list[str] = field(default_factory=list)  # their keys


# ------------------------------------------------------------------------------ the run


def submit_all(
    client: Any,
    name: str,
    count: int,
    span: float,
    t0: float,
    log: str,
    rng: random.Random,
    out: list[Submitted],
) -> None:
    """Submit ``count`` jobs through ``client``, one every ``span / count`` seconds."""
    from mpsched import MpschedError

    for n in range(count):
        time.sleep(max(0.0, t0 + n * span / count - time.time()))
        kind = rng.random()
        job = Submitted(
            key=f"{name}-{n}",
            began=time.time(),
            delay=rng.uniform(0.5, 5.0) if 0.6 <= kind < 0.9 else 0.0,
            retries=1 if kind >= 0.9 else 0,
        )
        try:
            job.future = client.schedule(
                chaos_job,
                log,
                job.key,
                rng.uniform(0.0, 0.02),
                delay=job.delay,
                retries=job.retries,
            )
        except MpschedError as exc:
            job.refused = type(exc).__name__
        out.append(job)


def faults(redis: Redis, managers: Managers, t0: float, run: Run) -> None:
    """The faults, at their times after ``t0`` (see the module docstring)."""

    def at(offset: float, name: str) -> None:
        time.sleep(max(0.0, t0 + offset - time.time()))
        run.faults[name] = time.time()

    at(6, "manager SIGKILL")
    managers.kill(2)
    at(9, "manager restarted")
    managers.restart(2)
    at(12, "manager SIGSTOP")
    managers.signal(1, signal.SIGSTOP)
    at(18, "manager SIGCONT")
    managers.signal(1, signal.SIGCONT)
    at(22, "Redis SIGKILL")
    redis.signal(signal.SIGKILL)
    at(24, "Redis restarted")
    run.answered["restart"] = redis.start()
    at(30, "Redis SIGSTOP")
    redis.signal(signal.SIGSTOP)
    at(45, "Redis SIGCONT")
    redis.signal(signal.SIGCONT)
    run.answered["pause"] = redis.wait_answers()


def chaos(jobs: int, seed: int, tmp: Path) -> tuple[Run, dict[str, list[Any]], str]:
    """Run it all; the run, the store's listing by state, and the log's path."""
    from mpsched import connect

    log = str(tmp / "runs.log")
    redis = Redis(tmp)
    managers = Managers(redis.url, 3, tmp)
    run = Run()
    clients = [
        connect(address, authkey=managers.key_file.read_bytes().strip())
        for address in managers.addresses
    ]
    try:
        t0 = time.time() + 1.0
        threads = [
            threading.Thread(
                target=submit_all,
                args=(
                    client,
                    f"c{n}",
                    jobs // 3 + (n < jobs % 3),
                    40.0,
                    t0,
                    log,
                    random.Random(seed + n),
                    run.jobs,
                ),
            )
            for n, client in enumerate(clients)
        ]
        threads.append(threading.Thread(target=faults, args=(redis, managers, t0, run)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(max(0.0, run.faults["Redis SIGCONT"] + SETTLE - time.time()))
        run.unresolved_at_settle = [
            j.key for j in run.jobs if j.future is not None and not j.future.done()
        ]
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            j.future is None or j.future.done() for j in run.jobs
        ):
            time.sleep(0.2)
        listing = clients[0].jobs()
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                client.detach()
        managers.stop()
        redis.stop()
    by_id: dict[str, list[Any]] = {}
    for record in listing:
        by_id.setdefault(record.job_id, []).append(record)
    return run, by_id, log


# ------------------------------------------------------------------------------ the report


def read_log(log: str) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Start and end instants of each key's runs."""
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    with open(log) as lines:
        for line in lines:
            mark, key, when, _pid = line.split()
            (starts if mark == "S" else ends).setdefault(key, []).append(float(when))
    return starts, ends


def outcome_of(job: Submitted) -> str:
    """How a job's future ended: "ok", an error's name, or "" (not resolved)."""
    if job.future is None or not job.future.done():
        return ""
    if job.future.cancelled():
        return "CancelledError"
    error = job.future.exception(timeout=0)
    return "ok" if error is None else type(error).__name__


def report(run: Run, listing: dict[str, list[Any]], log: str) -> dict[str, Any]:
    """The figures of the module docstring, from what the run saw."""
    starts, ends = read_log(log)
    stored = [
        (job, listing[job.future.job_id][0])
        for job in run.jobs
        if job.future is not None and job.future.job_id in listing
    ]
    lost = [
        job.key
        for job, rec in stored
        if rec.state not in ("done", "failed") or (rec.state == "done" and job.key not in starts)
    ]
    lost += [
        job.key for job in run.jobs if outcome_of(job) == "ok" and job.future.job_id not in listing
    ]
    false = [job.key for job, rec in stored if job.key in ends and rec.state == "failed"]
    told_crashed = [
        job.key for job, _ in stored if job.key in ends and outcome_of(job) == "WorkerCrashedError"
    ]
    first = {
        name: min((t for times in starts.values() for t in times if t >= at), default=float("inf"))
        - at
        for name, at in run.answered.items()
    }
    return {
        "jobs": len(run.jobs),
        "refused at the call site": dict(Counter(j.refused for j in run.jobs if j.refused)),
        "futures": dict(
            Counter(outcome_of(j) or "unresolved" for j in run.jobs if j.future is not None)
        ),
        "taken by the store": len(stored),
        "listed": dict(Counter(rec.state for _, rec in stored)),
        "lost": lost,
        "run twice with retries=0": [
            j.key for j in run.jobs if j.retries == 0 and len(starts.get(j.key, [])) > 1
        ],
        "runs of retries=1 jobs that ran twice": sum(
            1 for j in run.jobs if j.retries == 1 and len(starts.get(j.key, [])) > 1
        ),
        "started early": [
            j.key for j in run.jobs if starts.get(j.key) and min(starts[j.key]) < j.began + j.delay
        ],
        "false outcomes": false,
        "futures failed as crashed though the job ran to its end": told_crashed,
        f"futures unresolved {SETTLE:g} s after the last fault": len(run.unresolved_at_settle),
        "unresolved by client": dict(
            Counter(k.partition("-")[0] for k in run.unresolved_at_settle)
        ),
        "unresolved (a few ids)": [
            j.future.job_id for j in run.jobs if j.key in run.unresolved_at_settle
        ][:8],
        "unresolved: their last end (s after the first fault)": sorted(
            round(max(ends[k]) - min(run.faults.values()), 1)
            for k in run.unresolved_at_settle
            if k in ends
        )[::25],
        "first start after Redis answers (s)": {k: round(v, 3) for k, v in first.items()},
        "faults (s after the first)": {
            k: round(v - min(run.faults.values()), 2) for k, v in run.faults.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mpsched-chaos-"))
    started = time.monotonic()
    load = os.getloadavg()[0]
    try:
        run, listing, log = chaos(args.jobs, args.seed, tmp)
        figures = report(run, listing, log)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    figures["wall (s)"] = round(time.monotonic() - started, 1)
    figures["1-min load average before, after"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(figures, indent=1, default=str))
    bad = (
        figures["lost"]
        or figures["run twice with retries=0"]
        or figures["started early"]
        or figures["false outcomes"]
        or figures[f"futures unresolved {SETTLE:g} s after the last fault"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
