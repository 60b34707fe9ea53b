"""A pipeline: extract, then transform in parallel, then combine, then report.

``extract`` splits a range of numbers into 8 chunks. Eight ``transform`` jobs each count
the primes of one chunk, in parallel on the workers, each taking its chunk from
``ResultOf(extract)``. ``combine`` takes the eight counts as one list of ``ResultOf``: it
runs once the last transform ended, with their results in the list. ``report`` runs after
``combine``. Every job is submitted at once, before any runs: the manager holds each one
until its parents have ended, then hands it out, with their results, to a worker. The
client only waits for the last future.

A second, broken pipeline shows the failure rule: its extract raises, and every job
after it fails at once with DependencyFailedError, so nothing is left waiting.

Run it: ``python examples/pipeline.py``
"""

from __future__ import annotations

import time
from math import isqrt

from mpsched import DependencyFailedError, ResultOf, Scheduler

LIMIT = 200_000
CHUNKS = 8


def extract(limit: int, chunks: int) -> list[range]:
    """Split [2, limit) into ``chunks`` ranges."""
    step = (limit - 2) // chunks + 1
    return [range(start, min(start + step, limit)) for start in range(2, limit, step)]


def transform(chunks: list[range], index: int) -> int:
    """Count the primes of one chunk (trial division: real CPU work)."""
    return sum(1 for n in chunks[index] if all(n % d for d in range(2, isqrt(n) + 1)))


def combine(counts: list[int]) -> int:
    return sum(counts)


def report(total: int, started: float) -> str:
    return f"{total:,} primes below {LIMIT:,}, found in {time.monotonic() - started:.2f} s"


def broken_extract() -> list[range]:
    raise ConnectionError("the source is down")


def main() -> None:
    with Scheduler(workers=2) as s:
        started = time.monotonic()
        chunks = s.submit(extract, LIMIT, CHUNKS)
        parts = [s.schedule(transform, ResultOf(chunks), i) for i in range(CHUNKS)]
        total = s.schedule(combine, [ResultOf(p) for p in parts])
        done = s.schedule(report, ResultOf(total), started)
        print(f"submitted {2 + CHUNKS + 1} jobs; the manager runs them in order")
        print(done.result(timeout=60))
        assert total.result() == 17_984  # the primes below 200,000
        print(f"✓ {CHUNKS} transforms ran in parallel, each once, between extract and combine")

        bad = s.submit(broken_extract)
        after = [s.schedule(transform, ResultOf(bad), i) for i in range(CHUNKS)]
        last = s.schedule(combine, [ResultOf(p) for p in after])
        error = last.exception(timeout=60)
        assert isinstance(error, DependencyFailedError)
        failed = sum(isinstance(f.exception(), DependencyFailedError) for f in after)
        print(f"broken source: {failed} transforms and the combine failed at once: {error}")
        print("✓ nothing was left waiting after the failure")


if __name__ == "__main__":
    main()
