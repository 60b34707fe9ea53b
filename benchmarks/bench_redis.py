"""10. Several managers on one Redis: mpsched against RQ, arq and Celery, same redis-server.

One redis-server of the benchmark's own (loopback TCP, persistence off) serves every
contender in turn, flushed between them. Each contender runs 2 worker processes: mpsched
as 2 managers with 1 worker each (two Schedulers on one ``store="redis://..."``), RQ as 2
``rq worker`` processes (SimpleWorker: no fork per job, its fastest), arq as 2 ``arq``
workers (its defaults: 10 jobs at once each, a look every 0.5 s), Celery as 2 ``celery
worker -P solo`` processes on its Redis broker (results off). Every job appends to a file
(benchmarks.redis_peers): the same work for all, and what the benchmark reads to see what
ran, when and where.

- throughput: ``jobs`` jobs submitted as fast as each client API allows (mpsched
  ``submit``, RQ ``enqueue_many``, arq ``enqueue_job`` gathered, Celery ``apply_async``),
  from the first submit until the last job has run (or what ran in 30 s, for one that
  takes longer). Redis CPU per job: redis-server's own
  user + system CPU over the run; commands per job: its ``total_commands_processed``.
- lateness: the 500-job plan of section 2 at UTC instants (``at=``, ``enqueue_at``,
  ``_defer_until``, ``eta``); lateness = the job's wall-clock start minus its instant.
- redelivery: a job (retries allowed) runs on one worker; that worker (mpsched: its
  manager, with its worker) is SIGKILLed; the time until the job starts again elsewhere.
  mpsched's lease_timeout, arq's job_timeout and Celery's visibility_timeout are 5 s;
  RQ has no such setting for a killed worker's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from functools import partial
from typing import Any

from benchmarks._common import (
    Result,
    Section,
    Target,
    alternate,
    column,
    log,
    median,
    percentiles,
    ratios,
    summarise,
)
from benchmarks.bench_lateness import plan
from benchmarks.redis_peers import (
    URL_ENV,
    RedisServer,
    celery_mark,
    celery_stamp,
    mark,
    read_stamps,
    stamp_line,
    start_workers,
    stop_workers,
)

LEASE = 5.0  # mpsched lease_timeout, arq job_timeout, Celery visibility_timeout
REDELIVERY_CAP = 40.0  # seconds the benchmark waits for a killed worker's job to run again
THROUGHPUT_CAP = 30.0  # a slower contender's rate is what ran in this long


class Contender:
    """One scheduler on the shared server: started, fed, stopped."""

    name = ""

    def __init__(self, url: str, tmp: str, *, lease: float = LEASE) -> None:
        self.url, self.tmp, self.lease = url, tmp, lease

    def __enter__(self) -> Contender:
        self.start()
        path = os.path.join(self.tmp, f"warm-{time.monotonic_ns()}")
        self.submit_marks(path, 20)  # workers connected and warm before any timing
        if _wait_size(path, 20, 60)[1] < 20:
            raise RuntimeError(f"{self.name}: its workers ran nothing in 60 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def submit_marks(self, path: str, count: int) -> None: ...
    def submit_stamps(self, path: str, dues: list[float], hold: float = 0.0) -> None: ...
    def kill_runner(self, pid: int) -> None: ...


class Mpsched(Contender):
    name = "mpsched (2 managers x 1 worker)"

    def start(self) -> None:
        from mpsched import Scheduler

        self.schedulers = [
            Scheduler(workers=1, store=self.url, lease_timeout=self.lease) for _ in range(2)
        ]

    def stop(self) -> None:
        for s in self.schedulers:  # their managers leave the store before it stops
            s.shutdown(wait=True, cancel_futures=True)

    def submit_marks(self, path: str, count: int) -> None:
        for _ in range(count):
            self.schedulers[0].submit(mark, path)

    def submit_stamps(self, path: str, dues: list[float], hold: float = 0.0) -> None:
        for n, due in enumerate(dues):
            self.schedulers[0].schedule(stamp_line, path, f"j{n}", hold, at=due, retries=1)

    def kill_runner(self, pid: int) -> None:
        for s in self.schedulers:
            if pid in {w.pid for w in s.stats().workers}:
                os.kill(s._manager_process.pid, signal.SIGKILL)  # its worker follows
                return
        raise RuntimeError(f"no manager runs worker pid {pid}")


class Peer(Contender):
    kind = ""

    def start(self) -> None:
        self.workers = start_workers(self.kind, self.url, 2, scheduler=True, log_dir=self.tmp)

    def stop(self) -> None:
        stop_workers(self.workers)

    def kill_runner(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)


class Rq(Peer):
    name = "RQ (2 SimpleWorkers)"
    kind = "rq"

    def _queue(self) -> Any:
        import redis
        from rq import Queue

        return Queue("bench", connection=redis.Redis.from_url(self.url))

    def submit_marks(self, path: str, count: int) -> None:
        from rq import Queue

        queue = self._queue()
        queue.enqueue_many([Queue.prepare_data(mark, args=(path,)) for _ in range(count)])

    def submit_stamps(self, path: str, dues: list[float], hold: float = 0.0) -> None:
        from rq import Retry

        queue = self._queue()
        for n, due in enumerate(dues):
            queue.enqueue_at(
                datetime.fromtimestamp(due, timezone.utc),
                stamp_line,
                path,
                f"j{n}",
                hold,
                retry=Retry(max=1),
            )


class Arq(Peer):
    name = "arq (2 workers)"
    kind = "arq"

    def _enqueue(self, calls: list[tuple[Any, ...]], **options: Any) -> None:
        from arq import create_pool

        from benchmarks.redis_peers import arq_redis

        async def run() -> None:
            pool = await create_pool(arq_redis(self.url))
            try:
                for i in range(0, len(calls), 500):
                    await asyncio.gather(
                        *(
                            pool.enqueue_job(*call, _queue_name="bench", **opts)
                            for call, opts in calls[i : i + 500]
                        )
                    )
            finally:
                await pool.aclose()

        asyncio.run(run())

    def submit_marks(self, path: str, count: int) -> None:
        self._enqueue([(("arq_mark", path), {}) for _ in range(count)])

    def submit_stamps(self, path: str, dues: list[float], hold: float = 0.0) -> None:
        self._enqueue(
            [
                (
                    ("arq_stamp", path, f"j{n}", hold),
                    {"_defer_until": datetime.fromtimestamp(due, timezone.utc)},
                )
                for n, due in enumerate(dues)
            ]
        )


class Celery(Peer):
    name = "Celery (2 solo workers, Redis broker)"
    kind = "celery"

    def start(self) -> None:
        from benchmarks.redis_peers import celery_app

        celery_app.conf.broker_url = self.url  # before its first connection
        super().start()

    def submit_marks(self, path: str, count: int) -> None:
        for _ in range(count):
            celery_mark.apply_async((path,), queue="bench")

    def submit_stamps(self, path: str, dues: list[float], hold: float = 0.0) -> None:
        for n, due in enumerate(dues):
            celery_stamp.apply_async(
                (path, f"j{n}", hold), queue="bench", eta=datetime.fromtimestamp(due, timezone.utc)
            )


CONTENDERS: list[type[Contender]] = [Mpsched, Rq, Arq, Celery]


def _wait_size(path: str, size: int, timeout: float) -> tuple[float, int]:
    """Wait until ``path`` holds ``size`` bytes, at most ``timeout`` seconds; when it did
    (perf_counter), or the deadline, and the size then."""
    deadline = time.perf_counter() + timeout
    while True:
        held = os.path.getsize(path) if os.path.exists(path) else 0
        now = time.perf_counter()
        if held >= size or now > deadline:
            return now, held
        time.sleep(0.0005)


@contextlib.contextmanager
def _contender(kind: type[Contender], server: RedisServer) -> Iterator[Contender]:
    server.client.flushall()
    with (
        tempfile.TemporaryDirectory(prefix="mpsched-bench-") as tmp,
        kind(server.url + "?prefix=bench" if kind is Mpsched else server.url, tmp) as running,
    ):
        yield running


def run_throughput(kind: type[Contender], server: RedisServer, jobs: int) -> Result:
    with _contender(kind, server) as running:
        path = os.path.join(running.tmp, "marks")
        cpu, commands = server.cpu_seconds(), server.commands()
        started = time.perf_counter()
        running.submit_marks(path, jobs)
        ended, ran = _wait_size(path, jobs, THROUGHPUT_CAP - (time.perf_counter() - started))
        return {
            "jobs_per_s": ran / (ended - started),
            "redis_cpu_us": (server.cpu_seconds() - cpu) / jobs * 1e6,
            "commands": (server.commands() - commands) / jobs,
        }


def run_lateness(kind: type[Contender], server: RedisServer, offsets: list[float]) -> Result:
    with _contender(kind, server) as running:
        path = os.path.join(running.tmp, "stamps")
        first = time.time() + 0.5 + len(offsets) * 0.004
        dues = [first + o for o in offsets]
        running.submit_stamps(path, dues)
        if time.time() > first:
            log(f"warning: {kind.name} was still submitting when the first job fell due")
        _wait_size_lines(path, len(dues), offsets[-1] + 60)
        started = {k: t for k, t, _ in read_stamps(path)}
        late = [started[f"j{n}"] - due for n, due in enumerate(dues)]
        result = {k: v * 1e3 for k, v in percentiles(late).items()}
        result["min"] = min(late) * 1e3
        return result


def _wait_size_lines(path: str, lines: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(read_stamps(path)) < lines:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(read_stamps(path))} of {lines} jobs ran in {timeout} s")
        time.sleep(0.05)


def run_redelivery(kind: type[Contender], server: RedisServer) -> Result:
    with _contender(kind, server) as running:
        path = os.path.join(running.tmp, "held")
        running.submit_stamps(path, [time.time()], hold=120.0)
        _wait_size_lines(path, 1, 30)
        [(_, _, pid)] = read_stamps(path)
        running.kill_runner(pid)
        killed = time.time()
        deadline = time.monotonic() + REDELIVERY_CAP
        while len(read_stamps(path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stamps = read_stamps(path)
        return {"redelivery_s": stamps[1][1] - killed if len(stamps) > 1 else float("inf")}


def bench(jobs: int, lateness: tuple[int, float, int], repeats: int) -> Section:
    section = Section(
        key="redis",
        title=f"10. Several managers on one Redis: {jobs:,} no-op jobs, lateness, "
        f"redelivery after a SIGKILL; mpsched vs RQ, arq, Celery, 2 workers each",
        setup=__doc__.split("\n\n", 1)[1].split("\n\n- ")[0].replace("\n", " ") if __doc__ else "",
    )
    server = RedisServer()
    os.environ[URL_ENV] = server.url  # the peers' workers, and this process's clients
    try:
        offsets = plan(*lateness)
        for label, runner in (
            ("throughput", lambda k: run_throughput(k, server, jobs)),
            ("lateness", lambda k: run_lateness(k, server, offsets)),
        ):
            results = alternate([(k.name, partial(runner, k)) for k in CONTENDERS], repeats, label)
            _add(section, label, results)
        kills = alternate(
            [(k.name, partial(run_redelivery, k, server)) for k in CONTENDERS], 1, "redelivery"
        )
        for name, runs in kills.items():
            section.add(
                name,
                f"SIGKILL to redelivery (cap {REDELIVERY_CAP:g} s)",
                "s",
                column(runs, "redelivery_s"),
            )
        section.notes.append(
            f'Redelivery "inf": the killed worker\'s job had not run '
            f"again {REDELIVERY_CAP:g} s after the SIGKILL."
        )
    finally:
        server.stop()
    _targets(section)
    return section


def _add(section: Section, label: str, results: dict[str, list[Result]]) -> None:
    for name, runs in results.items():
        if label == "throughput":
            section.add(name, "throughput", "jobs/s", column(runs, "jobs_per_s"))
            section.add(name, "Redis CPU per job", "us", column(runs, "redis_cpu_us"))
            section.add(name, "Redis commands per job", "", column(runs, "commands"))
        else:
            for q in ("min", "p50", "p99", "max"):
                section.add(name, f"lateness {q}", "ms", column(runs, q))
    if label == "throughput":
        mine = column(results[Mpsched.name], "jobs_per_s")
        best = [
            max(values)
            for values in zip(
                *(column(results[k.name], "jobs_per_s") for k in CONTENDERS if k is not Mpsched),
                strict=True,
            )
        ]
        section.add(Mpsched.name, "throughput ÷ best peer", "x", ratios(mine, best))


def _targets(section: Section) -> None:
    def values(name: str, metric: str) -> list[float]:
        return next(m.values for m in section.metrics if m.contender == name and m.name == metric)

    tput = values(Mpsched.name, "throughput")
    section.targets.append(
        Target(
            "2 managers x 1 worker: >= 5,000 jobs/s",
            f"{summarise(tput)} jobs/s",
            median(tput) >= 5000,
        )
    )
    ratio = values(Mpsched.name, "throughput ÷ best peer")
    section.targets.append(
        Target(">= 3x the best peer's throughput", f"{summarise(ratio)}x", median(ratio) >= 3)
    )
    p99 = values(Mpsched.name, "lateness p99")
    section.targets.append(Target("lateness p99 <= 5 ms", f"{summarise(p99)} ms", median(p99) <= 5))
