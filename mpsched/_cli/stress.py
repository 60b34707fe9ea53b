"""The stress run: producer processes flood one manager; every job must run once, none early.

``run_stress`` starts a Scheduler (or uses a running manager), then ``producers`` spawned
processes that connect to it and together submit ``jobs`` jobs with random due times in
``[0, horizon]`` and random priorities. Each job appends its key to one O_APPEND log (a
single ``write``, so lines from concurrent workers never interleave) and returns its start
time on ``time.monotonic()``, which is system-wide on Linux and so comparable with the
producer's own clock. The log is then the ground truth of what ran::

    run_stress ──spawn──▶ producer 0..n-1 ──schedule(record, key, delay)──▶ manager
        ▲                     │  ▲                                            │
        │ ProducerReport      │  └──── futures: start times ◀── workers ◀────┘
        └─────────────────────┘                                   │
                             stress.log ◀── one "key\\n" per run ──┘

Verified: no key missing from the log, none in it twice, none unknown; no job started
before the earliest due time its producer computed before submitting it; every future
resolved with a result.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TextIO

from mpsched._cli.formats import plural
from mpsched._cli.options import Injection
from mpsched._client.client import connect
from mpsched._client.scheduler import Scheduler
from mpsched._core.job import Priority
from mpsched._core.leases import percentiles
from mpsched._transport.tls import TlsConfig, set_tls

# What a producer says over its pipe once connected, and what the parent answers once all
# are: they submit together.
READY = "ready"
GO = "go"

START_TIMEOUT = 60.0  # longest a producer may take to spawn, import mpsched and connect
RESULT_MARGIN = 120.0  # how long after the horizon a producer waits for its futures


@dataclass(frozen=True)
class ProducerSpec:
    """What one producer process is asked to do."""

    producer: int
    count: int
    address: Any
    authkey: bytes
    log_path: str
    horizon: float
    tls: TlsConfig | None = None  # TLS to the manager (a process's setting is its own)


@dataclass(frozen=True)
class ProducerReport:
    """What a producer sends back: its keys, early starts and its own lateness samples."""

    producer: int
    returned: tuple[str, ...]  # keys whose futures resolved with a start time
    early: int  # jobs that started before the earliest due time computed for them
    lateness: tuple[float, ...]  # start - earliest due, seconds, per returned job
    first_submit: float  # time.monotonic()
    last_done: float  # time.monotonic() once every future was resolved (or given up)
    crashed: tuple[str, ...] = ()  # keys that failed as WorkerCrashedError (a killed manager)


@dataclass(frozen=True)
class ProducerFailed:
    """Sent instead of a report when a producer raised."""

    producer: int
    reason: str


@dataclass
class StressReport:
    """The outcome of one stress run, as printed by :func:`run_stress`."""

    jobs: int
    producers: int
    workers: int | None  # None: the workers of a manager we only connected to
    elapsed: float = 0.0  # seconds, whole run
    busy: float = 0.0  # seconds from the first submit to the last future resolved
    manager_lateness: dict[str, float] | None = None
    manager_samples: int = 0
    producer_lateness: dict[str, float] = field(default_factory=dict)
    lost: int = 0  # expected keys missing from the log
    duplicated: int = 0  # keys in the log more than once
    unknown: int = 0  # keys in the log nobody submitted
    early: int = 0
    unresolved: int = 0  # expected keys whose futures never returned a start time
    crashed: int = 0  # keys whose manager was killed as they ran: at most one run each
    errors: list[str] = field(default_factory=list)  # producers that failed outright

    def problems(self) -> list[str]:
        """Each failed check as a phrase; empty when the run passed."""
        found = [
            f"{n} {what}"
            for n, what in (
                (self.lost, "lost (never ran)"),
                (self.duplicated, "duplicated (ran more than once)"),
                (self.unknown, "unknown (ran but never submitted)"),
                (self.early, "early (started before due)"),
                (self.unresolved, "unresolved (future without a result)"),
            )
            if n
        ]
        return found + self.errors

    @property
    def ok(self) -> bool:
        return not self.problems()


def record(log_path: str, key: str) -> float:
    """The stress job: append ``key`` to the log in one O_APPEND write; return the start."""
    started = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
    return started


def job_keys(producer: int, count: int) -> list[str]:
    """The keys producer ``producer`` submits; the verifier expects exactly these."""
    return [f"p{producer}-{i}" for i in range(count)]


def produce(spec: ProducerSpec, link: Connection) -> None:
    """A producer process: connect, wait for "go", submit, wait, report over ``link``.

    Sends READY once connected, then a ProducerReport, or a ProducerFailed at any point.
    """
    try:
        reply: ProducerReport | ProducerFailed = _produce(spec, link)
    except Exception as exc:
        reply = ProducerFailed(producer=spec.producer, reason=repr(exc))
    with contextlib.suppress(OSError):  # the parent gave up on us
        link.send(reply)


def _produce(spec: ProducerSpec, link: Connection) -> ProducerReport:
    rng = random.Random()
    priorities = list(Priority)
    set_tls(spec.tls)
    client = connect(spec.address, authkey=spec.authkey)
    try:
        link.send(READY)
        link.recv()  # GO: every producer connected, so they submit together
        first_submit = time.monotonic()
        submitted = []
        for key in job_keys(spec.producer, spec.count):
            delay = rng.uniform(0.0, spec.horizon)
            earliest = time.monotonic() + delay  # the manager's due time can only be later
            future = client.schedule(
                record, spec.log_path, key, delay=delay, priority=rng.choice(priorities)
            )
            submitted.append((key, earliest, future))
        concurrent.futures.wait([f for _, _, f in submitted], timeout=spec.horizon + RESULT_MARGIN)
        return report_of(spec.producer, submitted, first_submit)
    finally:
        client.shutdown(wait=False, cancel_futures=True)


def report_of(
    producer: int, submitted: list[tuple[str, float, Any]], first_submit: float
) -> ProducerReport:
    """What came back; a future not done, cancelled or failed leaves its key out."""
    returned, lateness = [], []
    early = 0
    for key, earliest, future in submitted:
        if future.done() and not future.cancelled() and future.exception() is None:
            started: float = future.result()
            returned.append(key)
            lateness.append(started - earliest)
            early += started < earliest
    return ProducerReport(
        producer=producer,
        returned=tuple(returned),
        early=early,
        lateness=tuple(lateness),
        first_submit=first_submit,
        last_done=time.monotonic(),
    )


def run_stress(
    *,
    producers: int,
    workers: int,
    jobs: int,
    horizon: float = 2.0,
    address: Any = None,
    authkey: bytes | None = None,
    tls: TlsConfig | None = None,
    inject: str | None = None,
    out: TextIO,
) -> int:
    """Flood a manager from ``producers`` processes; check every job ran once, none early.

    Args:
        producers: producer processes (spawned); they share the ``jobs`` between them.
        workers: worker processes of the Scheduler started here; ignored with ``address``.
        jobs: how many jobs in all, each due at a random time in ``[0, horizon]`` seconds
            after its submission, at a random priority.
        address, authkey: a running manager to use instead of starting a Scheduler.
        tls: how the producers connect to ``address`` over TCP (None: without TLS).
        inject: ``"duplicate"`` or ``"loss"`` plants that fault in the run log before it is
            verified. For testing the verifier only: the run then must FAIL.
        out: where the report goes.

    Returns:
        0 when every check passed, 1 otherwise (the last line printed says which).

    Raises:
        ValueError: a bad count, horizon or ``inject``, or ``address`` without ``authkey``.
    """
    _validate(producers, workers, jobs, horizon, address, authkey, inject)
    begun = time.monotonic()
    report = StressReport(
        jobs=jobs, producers=producers, workers=None if address is not None else workers
    )
    with tempfile.TemporaryDirectory(prefix="mpsched-stress-") as tmp:
        log_path = os.path.join(tmp, "stress.log")
        if address is None:
            _run_own(report, horizon, log_path)
        else:
            assert authkey is not None
            collect(report, run_producers(report, address, authkey, log_path, horizon, tls))
        if inject is not None:
            _inject(log_path, Injection.coerce(inject, "inject"))
        verify(report, log_path)
    report.elapsed = time.monotonic() - begun
    print_report(report, out)
    return 0 if report.ok else 1


def _validate(
    producers: int,
    workers: int,
    jobs: int,
    horizon: float,
    address: Any,
    authkey: bytes | None,
    inject: str | None,
) -> None:
    for name, value in (("producers", producers), ("workers", workers), ("jobs", jobs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    if not 0.0 <= horizon < float("inf"):
        raise ValueError(f"horizon must be a finite number of seconds >= 0, not {horizon!r}")
    if address is not None and authkey is None:
        raise ValueError("connecting to a running manager needs its authkey")
    if inject is not None:
        Injection.coerce(inject, "inject")  # ConfigError, a ValueError


def _run_own(report: StressReport, horizon: float, log_path: str) -> None:
    """Run the producers against a Scheduler of our own, always shut down afterwards."""
    assert report.workers is not None
    with Scheduler(workers=report.workers) as s:  # __exit__ shuts it down, even on error
        reports = run_producers(report, s.address, s.authkey, log_path, horizon)
        stats = s.stats().queue
    report.manager_lateness = stats.lateness
    report.manager_samples = stats.lateness_samples
    collect(report, reports)


def run_producers(
    report: StressReport,
    address: Any,
    authkey: bytes,
    log_path: str,
    horizon: float,
    tls: TlsConfig | None = None,
    target: Callable[[ProducerSpec, Connection], None] | None = None,
) -> list[ProducerReport | ProducerFailed]:
    """Start the producers, release them together, and gather what each sends back.
    ``address``: one manager's, or a list (producer p uses the p-th, in turn);
    ``target``: what each producer process runs (default: ``produce``)."""
    counts = _split(report.jobs, report.producers)
    where = address if isinstance(address, list) else [address]
    specs = [
        ProducerSpec(
            producer=p,
            count=n,
            address=where[p % len(where)],
            authkey=authkey,
            log_path=log_path,
            horizon=horizon,
            tls=tls,
        )
        for p, n in enumerate(counts)
    ]
    with _producer_processes(specs, target or produce) as links:
        replies = [_receive(p, link, START_TIMEOUT) for p, link in enumerate(links)]
        for link, reply in zip(links, replies, strict=True):
            if reply == READY:
                with contextlib.suppress(OSError):
                    link.send(GO)
        wait = horizon + RESULT_MARGIN + START_TIMEOUT
        return [
            _receive(p, link, wait) if reply == READY else reply
            for p, (link, reply) in enumerate(zip(links, replies, strict=True))
        ]


@contextlib.contextmanager
def _producer_processes(
    specs: list[ProducerSpec], target: Callable[[ProducerSpec, Connection], None]
) -> Iterator[list[Connection]]:
    """Spawned producer processes and our ends of their pipes; all gone on exit."""
    ctx = multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = []
    links: list[Connection] = []
    try:
        for spec in specs:
            ours, theirs = ctx.Pipe()
            # daemon: should this process fail, its producers must not keep it alive
            process = ctx.Process(
                target=target,
                args=(spec, theirs),
                daemon=True,
                name=f"mpsched-stress-producer-{spec.producer}",
            )
            process.start()
            theirs.close()  # so a producer that dies shows here as EOFError, not a hang
            processes.append(process)
            links.append(ours)
        yield links
    finally:
        _stop_processes(processes, links)


def _stop_processes(processes: list[BaseProcess], links: list[Connection]) -> None:
    for process in processes:
        process.join(10.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)
    for link in links:
        link.close()


def _receive(producer: int, link: Connection, timeout: float) -> Any:
    """The next message from a producer, or a ProducerFailed if it died or went silent."""
    try:
        if link.poll(timeout):
            return link.recv()
    except (EOFError, OSError):
        return ProducerFailed(producer=producer, reason="the process died")
    return ProducerFailed(producer=producer, reason=f"no message within {timeout:.0f} s")


def _split(jobs: int, producers: int) -> list[int]:
    """``jobs`` shared as evenly as possible; the first producers take one more."""
    share, extra = divmod(jobs, producers)
    return [share + (p < extra) for p in range(producers)]


def _expected_keys(report: StressReport) -> set[str]:
    counts = _split(report.jobs, report.producers)
    return {k for p, n in enumerate(counts) for k in job_keys(p, n)}


def collect(report: StressReport, replies: list[ProducerReport | ProducerFailed]) -> None:
    """Fold the producers' replies into ``report``: early starts, lateness, throughput."""
    reports = [r for r in replies if isinstance(r, ProducerReport)]
    report.errors += [
        f"producer {r.producer} failed: {r.reason}"
        for r in replies
        if isinstance(r, ProducerFailed)
    ]
    report.early = sum(r.early for r in reports)
    report.producer_lateness = percentiles([x for r in reports for x in r.lateness])
    if reports:
        report.busy = max(r.last_done for r in reports) - min(r.first_submit for r in reports)
    returned = {k for r in reports for k in r.returned}
    report.crashed = len({k for r in reports for k in r.crashed})
    report.unresolved = len(_expected_keys(report) - returned) - report.crashed


def _inject(log_path: str, inject: Injection) -> None:
    """Plant a fault in the run log: repeat or drop its first key."""
    with open(log_path) as log:
        lines = log.readlines()
    if not lines:  # nothing ran: the run fails anyway
        return
    if inject is Injection.DUPLICATE:
        lines.append(lines[0])
    else:
        del lines[0]
    with open(log_path, "w") as log:
        log.writelines(lines)


def verify(report: StressReport, log_path: str, crashed: set[str] | None = None) -> None:
    """Compare the run log with the keys submitted: lost, duplicated and unknown keys
    (a key in ``crashed`` may have run once, or not at all)."""
    expected = _expected_keys(report) - (crashed or set())
    runs: Counter[str] = Counter()
    if os.path.exists(log_path):
        with open(log_path) as log:
            runs.update(line.rstrip("\n") for line in log)
    report.lost = len(expected - runs.keys())
    report.duplicated = sum(1 for n in runs.values() if n > 1)
    report.unknown = len(runs.keys() - expected - (crashed or set()))


def print_report(report: StressReport, out: TextIO) -> None:
    workers = "those of the running manager" if report.workers is None else report.workers
    throughput = report.jobs / report.busy if report.busy > 0 else 0.0
    print(f"jobs:        {report.jobs}", file=out)
    print(f"producers:   {plural(report.producers, 'process')}", file=out)
    print(f"workers:     {workers}", file=out)
    print(f"elapsed:     {report.elapsed:.2f} s", file=out)
    print(
        f"throughput:  {throughput:.0f} jobs/s (first submit to last result, {report.busy:.2f} s)",
        file=out,
    )
    if report.crashed:
        print(
            f"crashed:     {report.crashed} (their manager was killed as they ran: "
            f"WorkerCrashedError, run at most once)",
            file=out,
        )
    if report.manager_lateness is not None:
        samples = plural(report.manager_samples, "job")
        print(
            f"lateness, manager (due -> start, last {samples}): {_ms(report.manager_lateness)}",
            file=out,
        )
    print(
        f"lateness, producers (submit call + delay -> start): {_ms(report.producer_lateness)}",
        file=out,
    )
    # The manager computes a job's due time when the job arrives; a producer, before its
    # submit call. Between the two the job waits in the producer's write-behind outbox.
    print(
        "  producers count from their submit call, so their figure adds each job's trip "
        "to the manager\n  (batched behind the one in flight while they flood it); the "
        "manager counts from its arrival",
        file=out,
    )
    problems = report.problems()
    if problems:
        print(f"FAIL: {'; '.join(problems)}", file=out)
    else:
        print(f"OK: {report.jobs} jobs ran exactly once, none early", file=out)


def _ms(lateness: dict[str, float]) -> str:
    return "  ".join(
        f"{name} {lateness.get(name, 0.0) * 1000:.1f} ms" for name in ("p50", "p90", "p99", "max")
    )
