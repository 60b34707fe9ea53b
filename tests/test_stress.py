"""Several producer processes and workers, thousands of jobs: exactly once, none early."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import jobs
import pytest

pytestmark = pytest.mark.slow

PRODUCERS = 3
JOBS_EACH = 2000


def test_many_producers_and_workers_run_every_job_exactly_once_never_early(
        make_scheduler, tmp_path):
    s = make_scheduler(workers=4)
    log_path = str(tmp_path / "runs.log")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PRODUCERS, mp_context=ctx) as producers:
        reports = list(producers.map(
            jobs.produce, [s.address] * PRODUCERS, [s.authkey] * PRODUCERS,
            range(PRODUCERS), [JOBS_EACH] * PRODUCERS, [log_path] * PRODUCERS,
            [2.0] * PRODUCERS, timeout=240))
    expected = {f"p{p}-{i}" for p in range(PRODUCERS) for i in range(JOBS_EACH)}
    assert sum(r["early"] for r in reports) == 0
    returned = Counter(k for r in reports for k in r["keys"])
    assert set(returned) == expected and max(returned.values()) == 1
    with open(log_path) as log:
        runs = Counter(line.strip() for line in log)
    assert set(runs) == expected, "a job was lost or an unknown job ran"
    assert max(runs.values()) == 1, "a job ran twice"
    stats = s.stats()
    assert stats.completed == PRODUCERS * JOBS_EACH
    assert stats.in_flight == 0 and sum(stats.pending.values()) == 0
