"""The producers of a stress run: spawned processes that connect to a manager, submit
their share of the jobs together, and send back what came of them."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from mpsched._cli.stress_report import (
    ProducerFailed,
    ProducerReport,
    StressReport,
    job_keys,
    shares,
)
from mpsched._client.client import connect
from mpsched._core.job import Priority
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


def record(log_path: str, key: str) -> float:
    """The stress job: append ``key`` to the log in one O_APPEND write; return the start."""
    started = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
    return started


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
    counts = shares(report.jobs, report.producers)
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
