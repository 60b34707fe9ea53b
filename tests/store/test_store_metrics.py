"""What a store tells the metrics endpoint: how long its commits take."""

from __future__ import annotations

import time
from pathlib import Path

from mpsched._store.base import StoredJob
from mpsched._store.memory import MemoryStore
from mpsched._store.sqlite import SQLiteStore

T0 = 1.8e9


def test_each_commit_is_timed_into_the_histogram(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db", clock=lambda: T0, prune_interval=3600.0)
    try:
        latency = store.commit_latency()
        assert latency is not None
        before, commits = latency.observations, store.commits
        store.submit(
            [
                StoredJob(
                    "job-1",
                    "client-1",
                    None,
                    "tests.jobs:work",
                    b"payload",
                    2,
                    T0,
                    1,
                    None,
                    0,
                    0,
                    T0,
                )
            ]
        )
        store._writer.call(lambda conn: time.sleep(0.05))  # a commit that takes 50 ms
        latency = store.commit_latency()
        assert latency is not None
        assert latency.observations - before == store.commits - commits >= 2
        slow = (
            latency.observations
            - dict(zip(latency.bounds, latency.cumulative(), strict=False))[0.025]
        )
        assert slow >= 1 and latency.total >= 0.05
    finally:
        store.close()


def test_a_store_that_never_commits_has_no_commit_latency() -> None:
    assert MemoryStore().commit_latency() is None
