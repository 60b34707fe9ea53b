"""Queues and limits: what routing costs, and whether a backlog behind a limit blocks others.

    python benchmarks/bench_queues.py [--jobs N] [--rounds N] [--backlog N] [--redis]

- no-op throughput on 2 workers, plain (every job in the default queue, no limit) against
  routed (4 queues served by every worker, each job under a limit of 1,000), alternating;
- the same on Redis, 2 managers x 1 worker, with ``--redis`` (needs redis-server);
- a backlog of ``--backlog`` due jobs behind a limit of 1, then 1,000 due jobs without a
  limit: how long until the last of those 1,000 started.

Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import scheduler
from benchmarks.jobs import noop, stamp

QUEUES = ("q0", "q1", "q2", "q3")
LIMITS = {f"l{n}": 1000 for n in range(4)}
WARM = 200


def _plain(s: Any, jobs: int) -> list[Any]:
    return [s.submit(noop) for _ in range(jobs)]


def _routed(s: Any, jobs: int) -> list[Any]:
    return [s.schedule(noop, queue=QUEUES[n % 4], limit=f"l{n % 4}") for n in range(jobs)]


def _rate(clients: list[Any], jobs: int, submit: Callable[[Any, int], list[Any]]) -> float:
    for client in clients:
        wait_futures(submit(client, WARM))
    start = time.perf_counter()
    futures = [f for client in clients for f in submit(client, jobs // len(clients))]
    wait_futures(futures)
    return jobs / (time.perf_counter() - start)


def run_local(kind: str, jobs: int) -> float:
    options: dict[str, Any] = {} if kind == "plain" else {"limits": LIMITS}
    with scheduler(workers=2, **options) as s:
        return _rate([s], jobs, _plain if kind == "plain" else _routed)


@contextmanager
def _redis_managers(url: str, routed: bool) -> Iterator[list[Any]]:
    from mpsched import Scheduler

    options: dict[str, Any] = {"limits": LIMITS} if routed else {}
    made = [Scheduler(workers=1, store=url, **options) for _ in range(2)]
    try:
        yield made
    finally:
        for s in made:
            s.shutdown(wait=True, cancel_futures=True)


def run_redis(kind: str, url: str, jobs: int) -> float:
    with _redis_managers(url, kind == "routed") as managers:
        return _rate(managers, jobs, _plain if kind == "plain" else _routed)


def run_backlog(backlog: int, free: int = 1000) -> dict[str, float]:
    """Seconds from the submit of ``free`` unlimited due jobs until the last one started,
    behind ``backlog`` due jobs of a limit of 1."""
    with scheduler(workers=2, limits={"one": 1}) as s:
        began = time.perf_counter()
        held = [s.schedule(noop, limit="one") for _ in range(backlog)]
        s.stats()  # every one of them is in the heap
        queued = time.perf_counter() - began
        start = time.monotonic()
        unlimited = [s.submit(stamp) for _ in range(free)]
        last = max(f.result() for f in unlimited)
        for f in held:
            f.cancel()
    return {"all_started_s": last - start, "backlog_submit_s": queued}


def _median(label: str, values: list[float]) -> float:
    value = statistics.median(values)
    print(f"  {label}: median {value:,.0f} (min {min(values):,.0f}, max {max(values):,.0f})")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--redis", action="store_true")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {"plain": [], "routed": []}
    for round_ in range(args.rounds):
        for kind in ("plain", "routed") if round_ % 2 == 0 else ("routed", "plain"):
            rates[kind].append(run_local(kind, args.jobs))
            print(f"memory {kind}: {rates[kind][-1]:,.0f} jobs/s", flush=True)
    print(f"no-op jobs/s, 2 workers, {args.jobs:,} jobs, {args.rounds} rounds:")
    ratios = [r / p for r, p in zip(rates["routed"], rates["plain"], strict=True)]
    _median("plain", rates["plain"])
    _median("4 queues, each job under a limit of 1,000", rates["routed"])
    print(
        f"  routed / plain: median {statistics.median(ratios):.2f} "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
    )
    if args.redis:
        _bench_redis(args.jobs // 4, args.rounds, args.backlog)
    result = run_backlog(args.backlog)
    print(
        f"backlog of {args.backlog:,} due jobs behind a limit of 1 (submitted in "
        f"{result['backlog_submit_s']:.1f} s), then 1,000 unlimited due jobs: the last "
        f"started {result['all_started_s']:.2f} s after their submit began"
    )
    return 0


@contextmanager
def _redis_server() -> Iterator[tuple[str, Any]]:
    """A redis-server of this benchmark's own on a free loopback port, persistence off."""
    import redis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="mpsched-bench-queues-")
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--redis needs redis-server")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            directory,
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        client.close()
        proc.kill()
        proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def run_redis_backlog(url: str, backlog: int) -> dict[str, float]:
    """A store's claims alone: ``backlog`` due jobs of a limit of 1 (submitted while it
    had room), then 10 due jobs without one; how many claims, how long, and the longest
    one, until the first of the 10 is claimed."""
    from mpsched._core.limits import LimitSpec
    from mpsched._store.redis.records import NewJob, Take
    from mpsched._store.redis.store import RedisStore

    store = RedisStore(url)
    try:
        store.heartbeat("m1", 30.0, b"")
        store.set_limit("one", LimitSpec(concurrency=1))
        for k in range(0, backlog, 2000):
            store.submit_jobs(
                [
                    NewJob(f"j{i}", "c", None, "f", b"p", 2, 0.0, None, None, 0, limit="one")
                    for i in range(k, min(k + 2000, backlog))
                ],
                "m1",
            )
        store.submit_jobs(
            [NewJob(f"free{i}", "c", None, "f", b"p", 2, 0.0, None, None, 0) for i in range(10)],
            "m1",
        )
        take = Take(want=1, worker="m1/w", lead="wait")
        store.report("m1", 30.0, take=take)  # the limit's one slot
        start, calls, longest = time.perf_counter(), 0, 0.0
        while True:
            began = time.perf_counter()
            reply = store.report("m1", 30.0, take=take)
            longest, calls = max(longest, time.perf_counter() - began), calls + 1
            if reply.jobs:
                break
        return {"seconds": time.perf_counter() - start, "claims": calls, "longest": longest}
    finally:
        store.close()


def _bench_redis(jobs: int, rounds: int, backlog: int) -> None:
    with _redis_server() as (url, client):
        rates: dict[str, list[float]] = {"plain": [], "routed": []}
        for round_ in range(rounds):
            for kind in ("plain", "routed") if round_ % 2 == 0 else ("routed", "plain"):
                client.flushall()
                rates[kind].append(run_redis(kind, url, jobs))
                print(f"redis {kind}: {rates[kind][-1]:,.0f} jobs/s", flush=True)
        print(f"no-op jobs/s on Redis, 2 managers x 1 worker, {jobs:,} jobs:")
        _median("plain", rates["plain"])
        _median("4 queues, each job under a limit of 1,000", rates["routed"])
        ratios = [r / p for r, p in zip(rates["routed"], rates["plain"], strict=True)]
        print(
            f"  routed / plain: median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )
        client.flushall()
        found = run_redis_backlog(url, backlog)
        print(
            f"redis: {backlog:,} due jobs behind a limit of 1, then 10 unlimited: the "
            f"first of those claimed after {found['claims']:.0f} claims in "
            f"{found['seconds']:.2f} s, the longest claim {found['longest'] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    raise SystemExit(main())
