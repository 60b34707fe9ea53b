"""The peers of section 10 (RQ, arq, Celery with its Redis broker): their job functions,
their worker settings, and the redis-server they all share with mpsched.

Every job appends to a file (one O_APPEND write), the same work for every contender: the
benchmark reads the file to see what ran, when (wall clock: ``at=``/``eta``/``_defer_until``
times are UTC) and where (pid). Workers import this module as ``benchmarks.redis_peers``
(``run.py`` puts the repository root on ``PYTHONPATH``); they find the server's URL in
``$MPSCHED_BENCH_REDIS``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

URL_ENV = "MPSCHED_BENCH_REDIS"
QUEUE = "bench"
# Where a peer goes when the benchmark did not say: nowhere (port 1 refuses), never a
# Redis that happens to run on this machine.
NOWHERE = "redis://127.0.0.1:1/0"


def bench_url() -> str:
    return os.environ.get(URL_ENV, NOWHERE)


# ------------------------------------------------------------------------------ jobs


def _append(path: str, data: bytes) -> None:
    """One write at the end of ``path`` (O_APPEND: runs in several processes never mix)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def mark(path: str) -> None:
    """The throughput job: one byte appended (the file's size counts the runs)."""
    _append(path, b".")


def stamp_line(path: str, key: str, hold: float = 0.0) -> None:
    """Append ``key wall-clock-start pid``, then sleep ``hold`` seconds."""
    _append(path, f"{key} {time.time()!r} {os.getpid()}\n".encode())
    if hold:
        time.sleep(hold)


def read_stamps(path: str) -> list[tuple[str, float, int]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(k, float(t), int(p)) for k, t, p in (line.split() for line in f)]


# ------------------------------------------------------------------------------ arq


async def arq_mark(ctx: dict[str, Any], path: str) -> None:
    mark(path)


async def arq_stamp(ctx: dict[str, Any], path: str, key: str, hold: float = 0.0) -> None:
    stamp_line(path, key, 0.0)
    if hold:
        import asyncio

        await asyncio.sleep(hold)


def arq_redis(url: str | None = None) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url or bench_url())


class ArqSettings:
    """``arq benchmarks.redis_peers.ArqSettings``: its defaults (``max_jobs=10`` jobs at
    once per worker, a look at the queue every ``poll_delay=0.5`` s), but a short job
    timeout (its redelivery after a crash waits for it). With ``max_jobs=1``, one job at a
    time per worker as every other contender's, it ran 4 no-op jobs/s: each look takes
    one job, then it sleeps 0.5 s."""

    functions: ClassVar[list[Any]] = [arq_mark, arq_stamp]
    redis_settings = arq_redis()
    queue_name = QUEUE
    job_timeout = 5
    max_tries = 2
    keep_result = 60


# ------------------------------------------------------------------------------ Celery


def _celery() -> Any:
    from celery import Celery

    app = Celery("benchmarks.redis_peers", broker=bench_url(), backend=None)
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        # Redelivery of a job whose worker died: acked late, back after the visibility
        # timeout (default 1 h; 5 s here, as arq's job timeout).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={"visibility_timeout": 5},
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
    )
    return app


celery_app = _celery()


@celery_app.task(name="bench.mark")
def celery_mark(path: str) -> None:
    mark(path)


@celery_app.task(name="bench.stamp")
def celery_stamp(path: str, key: str, hold: float = 0.0) -> None:
    stamp_line(path, key, hold)


# ------------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server of the benchmark's own on a loopback port (its defaults otherwise,
    persistence off: every contender pays the same), stopped with ``stop()``."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="mpsched-bench-redis-")
        self.port = free_port()
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("section 10 needs redis-server (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                f"{self.dir}/redis.log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        import redis

        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                self.client.ping()
                break
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.01)

    def cpu_seconds(self) -> float:
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def commands(self) -> int:
        stats = self.client.info("stats")
        # redis-py 5 (the one arq allows) types even a sync client's reply Awaitable[Any] | Any.
        assert isinstance(stats, dict)
        return int(stats["total_commands_processed"])

    def stop(self) -> None:
        self.client.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def worker_env(url: str) -> dict[str, str]:
    return {**os.environ, URL_ENV: url}


def start_workers(
    kind: str, url: str, count: int, *, scheduler: bool = False, log_dir: str
) -> list[subprocess.Popen[bytes]]:
    """``count`` worker processes of a peer, each in a session of its own."""
    procs = []
    for n in range(count):
        if kind == "rq":
            command = [
                "rq",
                "worker",
                "--url",
                url,
                "-w",
                "rq.worker.SimpleWorker",
                *(["--with-scheduler"] if scheduler and n == 0 else []),
                QUEUE,
            ]
        elif kind == "arq":
            command = ["arq", "benchmarks.redis_peers.ArqSettings"]
        else:
            command = [
                "celery",
                "-A",
                "benchmarks.redis_peers:celery_app",
                "worker",
                "-P",
                "solo",
                "-c",
                "1",
                "-Q",
                QUEUE,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "WARNING",
                "-n",
                f"w{n}@%h",
            ]
        binary = Path(os.path.dirname(os.path.abspath(sys.executable))) / command[0]
        with open(Path(log_dir) / f"{kind}-{n}.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [str(binary), *command[1:]],
                    env=worker_env(url),
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait(10)
