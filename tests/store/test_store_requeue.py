"""A failed or cancelled job requeued in a store: pending again under its id, with its
options, and still pending after the manager dies while the job's end is in the lease log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpsched._core.job import JobState
from mpsched._errors import InvalidJobError
from mpsched._store.base import StoredJob
from mpsched._store.lease_records import ended, leased, requeued, split
from mpsched._store.memory import MemoryStore
from mpsched._store.sqlite import SQLiteStore

WAIT = 30.0  # real seconds the child may take


def job(job_id: str, key: str | None = None) -> StoredJob:
    seq = ord(job_id[0])
    return StoredJob(
        job_id, "client-1", key, "jobs:work", b"payload", 1, 1000.0, seq, 30.0, 2, 0, 900.0
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryStore | SQLiteStore:
    made = (
        MemoryStore(result_ttl=3600)
        if request.param == "memory"
        else SQLiteStore(tmp_path / "jobs.db", durability="process")
    )
    request.addfinalizer(made.close)
    return made


def test_a_failed_job_is_pending_again_with_its_options_and_a_new_client(
    store: MemoryStore | SQLiteStore,
) -> None:
    store.submit([job("a"), job("b")])
    store.lease("a", "w1", 1)
    store.finish("a", JobState.FAILED, b"outcome", 1010.0)
    assert store.requeue_ended("b", "client-2", 2000.0) is None  # pending: not requeued
    again = store.requeue_ended("a", "client-2", 2000.0)
    assert again == (job("a")._replace(client_id="client-2", due_wall=2000.0), None)
    store.flush()
    record = store.get("a")
    assert record is not None
    assert (
        record.state,
        record.attempt,
        record.outcome,
        record.finished_wall,
        record.worker_id,
    ) == (JobState.PENDING, 0, None, None, None)
    assert [j.job_id for j in store.recover().pending] == ["a", "b"]
    assert store.requeue_ended("a", "client-2", 2000.0) is None  # pending now


def test_a_cancelled_job_whose_key_another_job_took_is_not_requeued(
    store: MemoryStore | SQLiteStore,
) -> None:
    store.submit([job("a", key="k")])
    store.cancel(["a"], 1005.0)
    store.submit([job("b", key="k")])
    with pytest.raises(InvalidJobError, match="key"):
        store.requeue_ended("a", "client-2", 2000.0)
    store.flush()
    record = store.get("a")
    assert record is not None and record.state is JobState.CANCELLED


def test_a_move_after_an_end_in_the_lease_log_undoes_the_end() -> None:
    records = [
        leased("a", "w1", 1),
        ended("a", JobState.FAILED, 1.0, b"x"),
        requeued("a", 0),
        leased("b", "w1", 1),
        ended("b", JobState.DONE, 2.0, None),
    ]
    moves, ends = split(records)
    assert set(ends) == {"b"}
    assert moves["a"] == requeued("a", 0)


CHILD = r"""
import os, sys
from mpsched._core.job import JobState
from mpsched._store.base import StoredJob
from mpsched._store.sqlite import SQLiteStore

store = SQLiteStore(sys.argv[1], durability="process")
store.submit([StoredJob("a", "c", None, "f", b"p", 2, 1000.0, 0, None, 0, 0, 900.0)])
store.lease("a", "w1", 1)
store.finish("a", JobState.FAILED, b"outcome", 1010.0)
assert store.requeue_ended("a", "c2", 2000.0) is not None
os._exit(0)  # as a SIGKILL: no close, the lease log holds the lease and the end
"""


def test_a_job_requeued_after_its_end_in_the_lease_log_is_pending_after_a_crash(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=WAIT
    )
    assert child.returncode == 0, child.stderr
    store = SQLiteStore(path, durability="process")
    try:
        assert [j.job_id for j in store.recover().pending] == ["a"]
        record = store.get("a")
        assert record is not None and record.state is JobState.PENDING
    finally:
        store.close()
