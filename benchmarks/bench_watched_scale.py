"""The status server at 1,000 and at 1,000,000 pending jobs: how long each endpoint takes
to answer, and what the lateness histogram costs a job. Not run by run.py; prints a table.

    .venv/bin/python -m benchmarks.bench_watched_scale

In-process: a ManagerService with its JobQueue filled with N jobs due in an hour (the same
~80-byte payloads as section 6), its status server on a loopback port, and a client in
this process asking each endpoint REQUESTS times on one kept-alive connection. The page
shows counts and the heap's head only, so its answer should not grow with N.
"""

from __future__ import annotations

import gc
import http.client
import statistics
import time
import timeit

from benchmarks.bench_scale import _payloads

REQUESTS = 200
PATHS = ("/api/dashboard", "/metrics", "/api/status", "/api/jobs?state=pending&limit=100")


def measure(pending: int) -> dict[str, tuple[float, float]]:
    """Median and p99 (ms) of each endpoint's answer at ``pending`` jobs."""
    from mpsched._core.job import JobRequest
    from mpsched._core.queue import JobQueue
    from mpsched._manager.http.server import StatusServer
    from mpsched._manager.service import ManagerService
    from mpsched._transport.http_access import HttpConfig

    queue = JobQueue()
    batch: list[JobRequest] = []
    for i, payload in enumerate(_payloads(pending)):
        batch.append(JobRequest(f"job-{i}", "bench", payload, 1 + i % 3, 3600.0 + i % 997, None))
        if len(batch) == 10_000:
            queue.submit_many(batch)
            batch = []
    if batch:
        queue.submit_many(batch)
    gc.collect()
    service = ManagerService(queue)
    server = StatusServer(HttpConfig("127.0.0.1", 0), service)
    server.start()
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    found: dict[str, tuple[float, float]] = {}
    try:
        for path in PATHS:
            took = []
            for _ in range(REQUESTS):
                begin = time.perf_counter()
                conn.request("GET", path)
                answer = conn.getresponse()
                answer.read()
                took.append((time.perf_counter() - begin) * 1e3)
                assert answer.status == 200, (path, answer.status)
            took.sort()
            found[path] = (statistics.median(took), took[int(len(took) * 0.99) - 1])
    finally:
        conn.close()
        server.stop()
        service.stop()
    return found


def observe_cost_ns() -> float:
    """One lateness observation (bisection of 18 bounds and two additions), call included."""
    from mpsched._core.histogram import LATENESS_BOUNDS, Histogram

    histogram = Histogram(LATENESS_BOUNDS)
    runs = 1_000_000
    return timeit.timeit(lambda: histogram.observe(0.00012), number=runs) / runs * 1e9


def main() -> None:
    rows = {n: measure(n) for n in (1_000, 1_000_000)}
    print("| endpoint | 1,000 pending: median / p99 | 1,000,000 pending: median / p99 |")
    print("|---|---:|---:|")
    for path in PATHS:
        small, big = rows[1_000][path], rows[1_000_000][path]
        print(f"| `{path}` | {small[0]:.2f} / {small[1]:.2f} ms | {big[0]:.2f} / {big[1]:.2f} ms |")
    print(f"\nHistogram.observe (the lateness bucket of one job): {observe_cost_ns():.0f} ns")


if __name__ == "__main__":
    main()
