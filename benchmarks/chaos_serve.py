"""Chaos on one manager with a SQLite store: what survives SIGKILLs and strangers.

A ``serve --store`` manager on a TCP loopback address with 2 local workers, a remote pool
of 2 (``worker --connect``), 3 client threads (each its own ``mpsched.connect()``) and a
holder of idle sockets from 127.0.0.1 that send nothing (a stranger on the same host),
reopened as the manager closes them. The clients submit ``--jobs`` jobs over about 20 s
(70% due now, 30% 0.5 to 5 s later; 2 ms of CPU each; ``retries=0``); meanwhile the
manager is SIGKILLed with its whole process group three times and started again on the
store, and the pool twice. A client whose submit finds its manager gone tries again once
it is back, as a program would.

Each job writes ``start KEY PID T`` and ``end KEY PID T`` (one O_APPEND write each) to a
log, and the report compares that log with each job's outcome:

- lost: an acknowledged job whose future never resolved (within ``--settle`` s after the
  last submit), or that ended done without a start line;
- run twice: more than one start line (every job has ``retries=0``);
- false outcomes: listed failed although its function wrote its end line, or failed as
  crashed although it never started;
- early: started before its due time by the wall clock (by more than 2 ms);
- clients served: each client's every job resolved, its submits all acknowledged.

``python -m benchmarks.chaos_serve [--jobs 5000] [--idle 500] [--seed 1] [--readme]``
(from the repository root, with the package installed: ``make`` builds ``.venv``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import mpsched
from benchmarks._common import _git_revision
from benchmarks.jobs import bracketed

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 3
DURATION = 20.0  # seconds over which the jobs are submitted
MANAGER_KILLS = (4.0, 10.0, 16.0)  # seconds into the run
POOL_KILLS = (7.0, 13.0)
EARLY_SLACK = 0.002  # a wall-clock start this much before due is within clock resolution
README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- chaos-serve -->", "<!-- /chaos-serve -->"


@dataclass
class Job:
    key: str
    due: float  # wall clock
    future: Future[str] | None = None


@dataclass
class Run:
    """One chaos run's processes, files and findings."""

    workdir: Path
    port: int
    key_file: Path
    log: Path
    env: dict[str, str]
    manager: subprocess.Popen[bytes] | None = None
    pool: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)  # when each new manager was up
    jobs: dict[int, list[Job]] = field(default_factory=dict)  # by client
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_manager(self) -> None:
        self.manager = self._start(
            "serve",
            "--store",
            str(self.workdir / "jobs.db"),
            "--workers",
            "2",
            "--address",
            self.address,
            "--authkey-file",
            str(self.key_file),
        )
        assert self.manager.stdout is not None
        line = self.manager.stdout.readline().decode()  # its banner: it listens
        assert "listening on" in line, line
        self.restarts.append(time.time())

    def start_pool(self) -> None:
        self.pool = self._start(
            "worker",
            "--connect",
            self.address,
            "--authkey-file",
            str(self.key_file),
            "--processes",
            "2",
        )

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        err = open(self.workdir / f"{args[0]}.err", "ab")  # noqa: SIM115 (the child's)
        return subprocess.Popen(
            [sys.executable, "-m", "mpsched", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            env=self.env,
            start_new_session=True,
        )

    def kill(self, proc: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL ``proc`` with its whole process group, at once."""
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def kill_all(self) -> None:
        self.kill(self.manager)
        self.kill(self.pool)


def hold_idle_sockets(run: Run, count: int) -> None:
    """Keep ``count`` connections open to the manager that never send a byte, opening a
    new one for each the manager closes (or that finds it down)."""
    held: list[socket.socket] = []
    while not run.stop.is_set():
        alive = []
        for sock in held:
            try:
                closed = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                sock.close()
            else:
                alive.append(sock)
        held = alive
        while len(held) < count and not run.stop.is_set():
            try:
                held.append(socket.create_connection(("127.0.0.1", run.port), timeout=1))
            except OSError:
                break  # the manager is down or its backlog is full: try again soon
        run.stop.wait(0.2)
    for sock in held:
        sock.close()


def submit_jobs(run: Run, client_no: int, count: int, seed: int) -> None:
    """One client: ``count`` jobs in batches over DURATION seconds."""
    rng = random.Random(seed * 100 + client_no)
    client = mpsched.connect(run.address, authkey=run.key_file.read_bytes().strip())
    jobs = run.jobs.setdefault(client_no, [])
    batches = max(1, int(DURATION / 0.1))
    per_batch = -(-count // batches)
    start = time.monotonic()
    try:
        for b in range(batches):
            batch = [
                Job(f"c{client_no}-{len(jobs) + i}", 0.0)
                for i in range(min(per_batch, count - len(jobs)))
            ]
            if not batch:
                break
            _submit_batch(client, run, batch, rng)
            jobs.extend(batch)
            time.sleep(max(0.0, start + (b + 1) * DURATION / batches - time.monotonic()))
    finally:
        run.jobs[client_no] = jobs
        with contextlib.suppress(Exception):
            _wait_all(jobs, 120.0)
        client.detach()


def _submit_batch(client: mpsched.Client, run: Run, batch: list[Job], rng: random.Random) -> None:
    for job in batch:
        job.due = time.time() + (0.0 if rng.random() < 0.7 else rng.uniform(0.5, 5.0))
    todo = batch
    while todo:
        try:
            for job in todo:
                job.future = client.schedule(bracketed, str(run.log), job.key, 0.002, at=job.due)
            client.stats()  # every job above is acknowledged
            return
        except mpsched.ManagerConnectionLostError:
            # The call that raised sent nothing; what went before it stays in the outbox
            # or the store, and resolves once the manager is back, unless it says it was
            # never sent.
            todo = [
                job
                for job in batch
                if job.future is None or (job.future.done() and _lost_unsent(job.future))
            ]
            for job in todo:
                job.future = None
            time.sleep(0.1)


def _lost_unsent(future: Future[str]) -> bool:
    error = future.exception(timeout=0)
    return isinstance(error, mpsched.ManagerConnectionLostError)


def _wait_all(jobs: list[Job], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for job in jobs:
        if job.future is not None:
            with contextlib.suppress(Exception):
                job.future.exception(timeout=max(0.0, deadline - time.monotonic()))


@dataclass
class Findings:
    jobs: int = 0
    done: int = 0
    crashed: int = 0  # started, never ended, failed as crashed: honest
    lost: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    unserved: list[int] = field(default_factory=list)
    back: list[float] = field(default_factory=list)  # restart -> first start, seconds


def judge(run: Run) -> Findings:
    starts: dict[str, list[float]] = {}
    ends: set[str] = set()
    for line in run.log.read_text().splitlines():
        what, key, _pid, at = line.split()
        if what == "start":
            starts.setdefault(key, []).append(float(at))
        else:
            ends.add(key)
    found = Findings()
    for client_no, jobs in sorted(run.jobs.items()):
        served = True
        for job in jobs:
            found.jobs += 1
            served = _judge_job(job, starts, ends, found) and served
        if not served:
            found.unserved.append(client_no)
    first_starts = sorted(at for runs in starts.values() for at in runs)
    for restarted in run.restarts[1:]:
        after = [at for at in first_starts if at >= restarted]
        if after:
            found.back.append(after[0] - restarted)
    return found


def _judge_job(job: Job, starts: dict[str, list[float]], ends: set[str], found: Findings) -> bool:
    runs = starts.get(job.key, [])
    if len(runs) > 1:
        found.twice.append(job.key)
    if runs and runs[0] < job.due - EARLY_SLACK:
        found.early.append(job.key)
    future = job.future
    if future is None or not future.done():
        found.lost.append(job.key)
        return False
    error = future.exception()
    if error is None:
        found.done += 1
        if not runs:
            found.lost.append(job.key)  # done, yet it never ran
        return True
    if isinstance(error, mpsched.WorkerCrashedError) and runs and job.key not in ends:
        found.crashed += 1
        return True
    found.false.append(f"{job.key}: {type(error).__name__}")
    return True


def chaos(jobs: int, idle: int, seed: int) -> Findings:
    workdir = Path(tempfile.mkdtemp(prefix="mps-chaos-"))
    key_file = workdir / "key"
    key_file.write_text(secrets.token_hex(16))
    key_file.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MPSCHED_AUTHKEY", None)
    run = Run(workdir, port, key_file, workdir / "runs.log", env)
    run.log.touch()
    run.start_manager()
    run.start_pool()
    threads = [threading.Thread(target=hold_idle_sockets, args=(run, idle), daemon=True)]
    shares = [jobs // CLIENTS + (n < jobs % CLIENTS) for n in range(CLIENTS)]
    threads += [
        threading.Thread(target=submit_jobs, args=(run, n, shares[n], seed)) for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    t0 = time.monotonic()
    try:
        events = sorted(
            [(at, "manager") for at in MANAGER_KILLS] + [(at, "pool") for at in POOL_KILLS]
        )
        for at, what in events:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            print(f"  {time.monotonic() - t0:5.1f} s: SIGKILL of the {what}", flush=True)
            if what == "manager":
                run.kill(run.manager)
                run.start_manager()
            else:
                run.kill(run.pool)
                run.start_pool()
        for thread in threads[1:]:
            thread.join()
    finally:
        run.stop.set()
        threads[0].join(5)
        run.kill_all()
    return judge(run)


def report(found: Findings, jobs: int, idle: int) -> str:
    def listed(items: list[str]) -> str:
        return str(len(items)) + (f" ({', '.join(items[:5])})" if items else "")

    back = ", ".join(f"{1000 * s:.0f}" for s in found.back) or "-"
    return "\n".join(
        [
            f"{jobs:,} jobs ({CLIENTS} clients), {len(MANAGER_KILLS)} manager SIGKILLs, "
            f"{len(POOL_KILLS)} pool SIGKILLs, {idle} idle sockets held throughout",
            "",
            "| what | count |",
            "|---|---:|",
            f"| jobs acknowledged | {found.jobs:,} |",
            f"| done | {found.done:,} |",
            f"| failed as crashed (started, never ended) | {found.crashed} |",
            f"| lost | {listed(found.lost)} |",
            f"| run twice (`retries=0`) | {listed(found.twice)} |",
            f"| false outcomes | {listed(found.false)} |",
            f"| started early | {listed(found.early)} |",
            f"| clients not served | {len(found.unserved)} of {CLIENTS} |",
            f"| restart to first job started, ms | {back} |",
        ]
    )


def write_readme(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = (
        f"*{stamp}, commit {_git_revision()}, `python -m benchmarks.chaos_serve`; load "
        f"average at the end {load}.*\n\n{text}"
    )
    page = README.read_text()
    block = f"{BEGIN}\n{text}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    README.write_text(
        pattern.sub(lambda _: block, page)
        if pattern.search(page)
        else page.rstrip("\n") + "\n\n" + block + "\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--idle", type=int, default=500, help="idle sockets held")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--readme", action="store_true", help="write the result into benchmarks/README.md"
    )
    args = parser.parse_args()
    found = chaos(args.jobs, args.idle, args.seed)
    text = report(found, args.jobs, args.idle)
    print(text)
    if args.readme:
        write_readme(text)
    clean = not (found.lost or found.twice or found.false or found.early or found.unserved)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
