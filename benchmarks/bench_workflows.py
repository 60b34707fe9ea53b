"""Workflows: how soon a child starts after its parent ended, and what a waiting graph
costs the manager in memory.

    python -m benchmarks.bench_workflows [--pairs N] [--parents N] [--children N]

1. Parent end -> child start: ``--pairs`` chains of two, one at a time, on 2 workers. The
   parent returns ``time.time()`` as it ends; the child takes it as ``ResultOf(parent)`` and
   returns its own start minus it. So the figure covers the parent's report, the release
   of the child, its hand-out and its unpickling: what a user waits between the two.
   Measured without a store, and on a Redis store of the benchmark's own shared by 2
   managers of 1 worker each (parents submitted through one, children through the other).
2. Memory: the manager's RSS growth for ``--parents`` parents due in an hour with
   ``--children`` dependents each (``after=[parent]``), against as many plain jobs due
   in an hour, each in a fresh manager.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any

import psutil

from mpsched import ResultOf, Scheduler


def ended_at() -> float:
    """A parent: its end, on the wall clock (the child runs on the same machine)."""
    return time.time()


def started_after(end: float) -> float:
    """A child: seconds from its parent's end to its own start."""
    return time.time() - end


def noop(x: Any = None) -> Any:
    return x


def latency(parents: Scheduler, children: Scheduler, pairs: int) -> dict[str, float]:
    for _ in range(20):  # warm the workers: each imports this module once
        parents.submit(noop).result(timeout=30)
        children.submit(noop).result(timeout=30)
    gaps = []
    for _ in range(pairs):
        parent = parents.submit(ended_at)
        gaps.append(children.schedule(started_after, ResultOf(parent.job_id)).result(timeout=30))
    gaps.sort()
    return {
        "p50_ms": 1000 * statistics.median(gaps),
        "p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
        "max_ms": 1000 * gaps[-1],
    }


def manager_rss(s: Scheduler) -> int:
    s.stats()  # what was submitted has reached the manager
    pid = s._manager_process.pid  # the benchmark reads its manager's memory
    assert pid is not None
    return int(psutil.Process(pid).memory_info().rss)


def memory(parents: int, children: int) -> dict[str, float]:
    total = parents * (children + 1)
    with Scheduler(workers=1) as s:
        before = manager_rss(s)
        futures = [s.schedule(noop, i, delay=3600) for i in range(total)]
        plain = manager_rss(s) - before
        s.shutdown(wait=False, cancel_futures=True)
        del futures
    gc.collect()
    with Scheduler(workers=1) as s:
        before = manager_rss(s)
        started = time.monotonic()
        tops = [s.schedule(noop, i, delay=3600) for i in range(parents)]
        kept = [s.schedule(noop, j, after=[top]) for top in tops for j in range(children)]
        submit_s = time.monotonic() - started
        graph = manager_rss(s) - before
        assert s.job_info(kept[-1].job_id).waiting_for == "after 1 jobs"
        s.shutdown(wait=False, cancel_futures=True)
    return {
        "jobs": total,
        "plain_mib": plain / 2**20,
        "graph_mib": graph / 2**20,
        "ratio": graph / plain,
        "plain_bytes_per_job": plain / total,
        "graph_bytes_per_job": graph / total,
        "graph_submit_s": submit_s,
    }


def redis_server() -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of this benchmark's own on a free loopback port, persistence off."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("this benchmark needs redis-server (or --skip-redis)")
    server = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            tempfile.gettempdir(),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as conn:
            if conn.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.02)
    server.kill()
    raise SystemExit("redis-server did not start")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--parents", type=int, default=10_000)
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--skip-redis", action="store_true")
    args = parser.parse_args(argv)
    with Scheduler(workers=2) as s:
        print("parent end -> child start, no store:", latency(s, s, args.pairs), flush=True)
    if not args.skip_redis:
        server, url = redis_server()
        try:
            one = Scheduler(workers=1, store=url)
            two = Scheduler(workers=1, store=url)
            try:
                print(
                    "parent end -> child start, Redis, 2 managers:",
                    latency(one, two, args.pairs),
                    flush=True,
                )
            finally:
                one.shutdown(cancel_futures=True)
                two.shutdown(cancel_futures=True)
        finally:
            server.kill()
            server.wait(10)
    print("memory:", memory(args.parents, args.children), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
