"""The Store contract on every backend: MemoryStore (with results retained, as a store
would), SQLiteStore over a real file, and RedisStore on a redis-server of the test run's
own. What a journal store is told by its manager (which job is leased, when a job ended),
a shared store decides itself; store_drivers makes the same calls on each, and a fake
wall clock decides expiry (for Redis, by ageing its keys' expiries as the clock moves).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_drivers import T0, TTL, JournalDriver, RedisDriver, Wall, job, record

from mpsched._core.job import JobState
from mpsched._errors import InvalidJobError, StoreError
from mpsched._store.base import StoredSchedule
from mpsched._store.memory import MemoryStore
from mpsched._store.redis.store import RedisStore
from mpsched._store.sqlite import SQLiteStore

Driver = JournalDriver | RedisDriver


@pytest.fixture
def wall() -> Wall:
    return Wall(T0)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def driver(request: pytest.FixtureRequest, wall: Wall, tmp_path: Path) -> Iterator[Driver]:
    made: Any
    if request.param == "memory":
        made = JournalDriver(MemoryStore(result_ttl=TTL, clock=wall), wall)
    elif request.param == "sqlite":
        made = JournalDriver(SQLiteStore(tmp_path / "jobs.db", result_ttl=TTL, clock=wall), wall)
    else:
        made = RedisDriver(RedisStore(request.getfixturevalue("redis_url"), result_ttl=TTL), wall)
    yield made
    made.store.close()


def state_of(driver: Driver, job_id: str) -> JobState | None:
    found = record(driver, job_id)
    return None if found is None else found.state


@pytest.mark.parametrize("state", [JobState.DONE, JobState.FAILED])
def test_a_finished_job_keeps_its_outcome_and_is_not_pending(
    driver: Driver, state: JobState
) -> None:
    driver.submit([job(1), job(2)])
    driver.lease("job-1", "worker-1")
    driver.finish("job-1", state, b"\x80opaque outcome", T0 + 10)
    found = record(driver, "job-1")
    assert found is not None
    assert (found.state, found.outcome, found.worker_id) == (
        state,
        b"\x80opaque outcome",
        "worker-1",
    )
    assert found.finished_wall == driver.when(T0 + 10)
    assert driver.pending() == ["job-2"]
    assert driver.running() == []
    assert [r.job_id for r in driver.store.jobs(state)] == ["job-1"]
    # Listings leave outcomes out, but for failed jobs' (their error is listed).
    listed = driver.store.jobs(state)[0].outcome
    assert listed == (b"\x80opaque outcome" if state is JobState.FAILED else None)


def test_a_leased_job_is_running_with_its_worker_and_attempt(driver: Driver) -> None:
    driver.submit([job(1, retries=1), job(2)])
    driver.lease("job-1", "worker-7")
    found = record(driver, "job-1")
    assert found is not None and found.state is JobState.RUNNING
    assert found.worker_id == "worker-7" and found.attempt == 1
    assert (driver.pending(), driver.running()) == (["job-2"], ["job-1"])


def test_cancel_affects_pending_jobs_only(driver: Driver) -> None:
    driver.submit([job(1), job(2), job(3)])
    driver.lease("job-2", "worker-1")
    driver.cancel(["job-1", "job-2", "unknown"], T0 + 1)
    assert state_of(driver, "job-1") is JobState.CANCELLED
    assert state_of(driver, "job-2") is JobState.RUNNING
    assert driver.pending() == ["job-3"]
    assert driver.running() == ["job-2"]


def test_listing_filters_by_state_in_seq_order_with_a_limit(driver: Driver) -> None:
    store = driver.store
    driver.submit([job(n) for n in range(1, 6)])
    driver.lease("job-4", "w")
    driver.cancel(["job-2"], T0)
    store.flush()  # listings read what is committed
    assert [r.job_id for r in store.jobs()] == ["job-1", "job-2", "job-3", "job-4", "job-5"]
    assert [r.job_id for r in store.jobs(JobState.PENDING)] == ["job-1", "job-3", "job-5"]
    assert [r.job_id for r in store.jobs(JobState.PENDING, limit=2)] == ["job-1", "job-3"]
    assert [r.job_id for r in store.jobs(JobState.RUNNING)] == ["job-4"]
    assert store.jobs(JobState.DONE) == []
    assert store.get("job-9") is None


def test_a_key_is_held_while_pending_running_or_retained(driver: Driver, wall: Wall) -> None:
    store = driver.store
    assert driver.submit([job(1, key="nightly")]) == ["job-1"]
    assert driver.submit([job(2, key="nightly")]) == ["job-1"]  # pending holds it
    driver.lease("job-1", "w")
    assert driver.submit([job(3, key="nightly")]) == ["job-1"]  # running holds it
    driver.finish("job-1", JobState.FAILED, b"boom", T0)
    store.flush()
    wall.now = T0 + TTL - 1
    assert driver.submit([job(4, key="nightly")]) == ["job-1"]  # a retained outcome holds it
    found = store.find_key("nightly")
    assert found is not None and (found.job_id, found.outcome) == ("job-1", b"boom")
    wall.now = T0 + TTL  # expired: the key is free, the old job forgotten
    assert store.find_key("nightly") is None
    assert driver.submit([job(5, key="nightly")]) == ["job-5"]
    assert driver.pending() == ["job-5"]
    assert store.get("job-2") is None and store.get("job-3") is None


def test_a_cancelled_job_frees_its_key(driver: Driver) -> None:
    driver.submit([job(1, key="k")])
    driver.cancel(["job-1"], T0)
    assert driver.store.find_key("k") is None
    assert driver.submit([job(2, key="k")]) == ["job-2"]
    found = driver.store.find_key("k")
    assert found is not None and found.job_id == "job-2"


def test_a_key_repeated_in_one_batch_maps_to_its_first_job(driver: Driver) -> None:
    ids = driver.submit([job(1, key="a"), job(2, key="b"), job(3, key="a"), job(4)])
    assert ids == ["job-1", "job-2", "job-1", "job-4"]
    assert driver.pending() == ["job-1", "job-2", "job-4"]


def test_a_repeated_job_id_fails_its_whole_batch(driver: Driver) -> None:
    driver.submit([job(1)])
    with pytest.raises(InvalidJobError):
        driver.submit([job(2), job(1)._replace(seq=7)])
    with pytest.raises(InvalidJobError):
        driver.submit([job(5), job(5)._replace(seq=6)])
    assert driver.pending() == ["job-1"]
    assert driver.submit([job(2)]) == ["job-2"]  # the store goes on


def test_prune_forgets_jobs_finished_result_ttl_ago(driver: Driver, wall: Wall) -> None:
    store = driver.store

    def prune(now: float) -> int:
        if driver.shared:
            wall.now = now  # Redis forgets by its clock; prune drops what it forgot
        return store.prune(now)

    driver.submit([job(1), job(2), job(3)])
    driver.lease("job-1", "w")
    driver.finish("job-1", JobState.DONE, b"ok", T0)
    driver.cancel(["job-2"], T0 + 100)
    store.flush()
    assert prune(T0 + TTL - 1) == 0
    assert prune(T0 + TTL) == 1
    assert store.get("job-1") is None and store.get("job-2") is not None
    assert prune(T0 + 100 + TTL) == 1
    assert [r.job_id for r in store.jobs()] == ["job-3"]


def test_finish_takes_done_or_failed_only(driver: Driver) -> None:
    driver.submit([job(1)])
    driver.lease("job-1", "w")
    for state in (JobState.PENDING, JobState.RUNNING, JobState.CANCELLED):
        with pytest.raises(InvalidJobError):
            driver.finish("job-1", state, None, T0)
    assert state_of(driver, "job-1") is JobState.RUNNING


def test_a_closed_store_refuses_writes(driver: Driver) -> None:
    driver.store.close()
    driver.store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        driver.submit([job(1)])
    with pytest.raises(StoreError, match="closed"):
        driver.finish("job-1", JobState.DONE, None, T0)


def test_schedules_are_saved_replaced_updated_and_deleted_in_order(driver: Driver) -> None:
    store = driver.store
    store.save_schedule(StoredSchedule("a", b"spec", b"s1"))
    store.save_schedule(StoredSchedule("b", b"spec", b"s1"))
    store.save_schedule(StoredSchedule("a", b"spec 2", b"s2"))  # replaced, keeps its place
    store.update_schedule("b", b"s3")
    store.update_schedule("unknown", b"ignored")
    assert store.schedules() == [
        StoredSchedule("a", b"spec 2", b"s2"),
        StoredSchedule("b", b"spec", b"s3"),
    ]
    store.delete_schedule("a")
    store.delete_schedule("unknown")
    assert [s.schedule_id for s in store.schedules()] == ["b"]
