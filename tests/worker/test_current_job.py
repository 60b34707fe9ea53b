"""The running job's context in the worker (mpsched._worker.context), in-process: what
``current_job()`` says around ``run``, the checks of a progress value, and the sender that
coalesces progress (driven by events, never by sleeping)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import cloudpickle
import pytest

import mpsched
from mpsched._core.job import Assignment, Lease
from mpsched._core.progress import MAX_PROGRESS, decode_progress, encode_progress
from mpsched._core.recurring import run_id
from mpsched._worker import context
from mpsched._worker.context import ProgressSender, ProgressUpdate
from mpsched._worker.run import run

WAIT = 30.0


@pytest.fixture(autouse=True)
def unbound() -> Iterator[None]:
    """No manager: what a test binds is undone after it."""
    context.bind(None, None)
    yield
    context.bind(None, None)


def assignment(
    fn: Any, *, job_id: str = "job-1", attempt: int = 1, at: float | None = None
) -> Assignment:
    payload = cloudpickle.dumps((fn, (), {}))
    return Assignment(Lease(7, job_id, "w", attempt), payload, None, None, 0.0, at)


def describe() -> dict[str, Any]:
    job = mpsched.current_job()
    assert job is not None
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "due": job.due,
        "schedule_id": job.schedule_id,
        "max_retries": job.max_retries,
    }


def test_a_job_sees_its_context_and_none_is_left_after_it() -> None:
    context.bind(lambda updates: None, lambda job_id: {"job-1": 3}[job_id])
    before = time.time()
    outcome = run(assignment(describe, attempt=2))
    seen = cloudpickle.loads(outcome.payload)
    assert (seen["job_id"], seen["attempt"], seen["schedule_id"], seen["max_retries"]) == (
        "job-1",
        2,
        None,
        3,
    )
    assert before - 1 < seen["due"].timestamp() <= time.time()
    assert mpsched.current_job() is None


def test_the_due_time_of_a_run_is_its_slot_and_of_an_at_job_its_instant() -> None:
    slot = datetime(2026, 12, 3, 2, 30, tzinfo=timezone.utc).timestamp()
    seen = cloudpickle.loads(
        run(assignment(describe, job_id=run_id("nightly", slot)), start_at=time.monotonic()).payload
    )
    assert (seen["schedule_id"], seen["due"].timestamp()) == ("nightly", slot)
    at = time.time() - 5.25
    seen = cloudpickle.loads(run(assignment(describe, at=at)).payload)
    assert abs(seen["due"].timestamp() - at) < 1e-6 and seen["schedule_id"] is None


def test_a_job_that_raises_leaves_no_context_behind() -> None:
    def boom() -> None:
        assert mpsched.current_job() is not None
        raise KeyError("x")

    assert not run(assignment(boom)).ok
    assert mpsched.current_job() is None


@pytest.mark.parametrize("value", [0, 1, 0.5, {"rows": 3, "of": 10}, {}])
def test_good_progress_values_round_trip(value: Any) -> None:
    assert decode_progress(encode_progress(value)) == value


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -0.01,
        1.01,
        True,
        None,
        "50%",
        [0.5],
        {"a": {1, 2}},
        {"text": "x" * MAX_PROGRESS},
    ],
    ids=repr,
)
def test_bad_progress_values_raise_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="progress"):
        encode_progress(value)


def test_the_sender_coalesces_what_is_set_while_it_sends_and_the_latest_wins() -> None:
    batches: list[list[ProgressUpdate]] = []
    sending, release, second = threading.Event(), threading.Event(), threading.Event()

    def send(batch: list[ProgressUpdate]) -> None:
        batches.append(batch)
        if len(batches) == 1:
            sending.set()
            assert release.wait(WAIT)
        else:
            second.set()

    sender = ProgressSender(send, linger=0.0)
    sender.put(1, "a", "0.1")
    assert sending.wait(WAIT)  # the first value is on its way; these wait for it
    for value in ("0.2", "0.3", "0.4"):
        sender.put(1, "a", value)
    sender.put(2, "b", "0.5")
    release.set()
    assert second.wait(WAIT)
    assert batches == [[(1, "a", "0.1")], [(1, "a", "0.4"), (2, "b", "0.5")]]


def test_set_progress_sends_through_the_bound_manager_only() -> None:
    got = threading.Event()
    sent: list[list[ProgressUpdate]] = []

    def send(batch: list[ProgressUpdate]) -> None:
        sent.append(batch)
        got.set()

    def report() -> None:
        job = mpsched.current_job()
        assert job is not None
        job.set_progress(0.75)

    assert run(assignment(report)).ok  # unbound: nowhere to send, and no error
    context.bind(send, None)
    assert run(assignment(report)).ok
    assert got.wait(WAIT)
    assert sent[0] == [(7, "job-1", "0.75")]
