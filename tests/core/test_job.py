from __future__ import annotations

import pickle
from typing import Any

import pytest

from mpsched._core.job import (
    MAX_EPOCH,
    Assignment,
    Job,
    JobRequest,
    Lease,
    Order,
    Outcome,
    Priority,
    check_request,
)
from mpsched._errors import ConfigError, InvalidJobError, MpschedError


def make_job(job_id: str, *, due: float, priority: Priority, seq: int) -> Job:
    return Job(job_id, "client", b"payload-" + job_id.encode(), priority.level, due, seq)


# ------------------------------------------------------------------------------ Priority


@pytest.mark.parametrize(
    ("member", "level"),
    [(Priority.HIGH, 1), (Priority.MEDIUM, 2), (Priority.LOW, 3)],
    ids=["high", "medium", "low"],
)
def test_priority_levels_are_explicit(member: Priority, level: int) -> None:
    assert member.level == level
    assert isinstance(member.level, int)


def test_lower_level_means_more_urgent() -> None:
    by_level = sorted(Priority, key=lambda p: p.level)
    assert by_level == [Priority.HIGH, Priority.MEDIUM, Priority.LOW]


@pytest.mark.parametrize("member", list(Priority), ids=lambda p: p.name.lower())
def test_priority_coerce_returns_members_unchanged(member: Priority) -> None:
    assert Priority.coerce(member) is member


@pytest.mark.parametrize(
    ("name", "member"),
    [
        ("high", Priority.HIGH),
        ("HIGH", Priority.HIGH),
        ("Medium", Priority.MEDIUM),
        ("mEdIuM", Priority.MEDIUM),
        ("low", Priority.LOW),
        (" LOW ", Priority.LOW),
        ("\thigh\n", Priority.HIGH),
    ],
)
def test_priority_coerce_accepts_names_in_any_case(name: str, member: Priority) -> None:
    assert Priority.coerce(name) is member


@pytest.mark.parametrize(
    "value",
    ["urgent", "", "  ", "hi", "high priority", "1", "level", 1, 2.0, None, b"high", ["high"]],
    ids=repr,
)
def test_priority_coerce_rejects_unknown_names_and_other_types(value: object) -> None:
    with pytest.raises(InvalidJobError) as caught:
        Priority.coerce(value)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, MpschedError)
    assert repr(value) in str(caught.value)


# --------------------------------------------------------------------------------- Order


@pytest.mark.parametrize(
    ("value", "member"),
    [
        ("time", Order.TIME),
        ("priority", Order.PRIORITY),
        (Order.TIME, Order.TIME),
        (Order.PRIORITY, Order.PRIORITY),
    ],
    ids=["time-name", "priority-name", "time-member", "priority-member"],
)
def test_order_coerce_accepts_members_and_values(value: Order | str, member: Order) -> None:
    assert Order.coerce(value) is member


@pytest.mark.parametrize("value", ["fifo", "", "deadline", None, 1], ids=repr)
def test_order_coerce_rejects_unknown_orders(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Order.coerce(value)
    assert isinstance(caught.value, ValueError)
    assert repr(value) in str(caught.value)


def test_order_members_are_their_option_strings() -> None:
    assert isinstance(Order.TIME, str)
    assert (Order.TIME.value, Order.PRIORITY.value) == ("time", "priority")


# ----------------------------------------------------------------------------- Job keys


def test_time_key_is_due_then_level_then_seq() -> None:
    job = make_job("a", due=12.5, priority=Priority.LOW, seq=7)
    assert job.time_key() == (12.5, 3, 7)


def test_priority_key_is_level_then_due_then_seq() -> None:
    job = make_job("a", due=12.5, priority=Priority.LOW, seq=7)
    assert job.priority_key() == (3, 12.5, 7)


def test_time_key_orders_earliest_due_then_priority_then_submission() -> None:
    jobs = [
        make_job("late-high", due=20.0, priority=Priority.HIGH, seq=0),
        make_job("low", due=10.0, priority=Priority.LOW, seq=1),
        make_job("medium", due=10.0, priority=Priority.MEDIUM, seq=2),
        make_job("high-second", due=10.0, priority=Priority.HIGH, seq=4),
        make_job("high-first", due=10.0, priority=Priority.HIGH, seq=3),
        make_job("early-low", due=5.0, priority=Priority.LOW, seq=5),
    ]
    ordered = [j.job_id for j in sorted(jobs, key=Job.time_key)]
    assert ordered == ["early-low", "high-first", "high-second", "medium", "low", "late-high"]


def test_priority_key_orders_priority_then_earliest_due_then_submission() -> None:
    jobs = [
        make_job("low-early", due=1.0, priority=Priority.LOW, seq=0),
        make_job("high-late", due=9.0, priority=Priority.HIGH, seq=1),
        make_job("high-early", due=2.0, priority=Priority.HIGH, seq=2),
        make_job("medium-b", due=4.0, priority=Priority.MEDIUM, seq=4),
        make_job("medium-a", due=4.0, priority=Priority.MEDIUM, seq=3),
    ]
    ordered = [j.job_id for j in sorted(jobs, key=Job.priority_key)]
    assert ordered == ["high-early", "high-late", "medium-a", "medium-b", "low-early"]


def test_keys_never_reach_the_payload() -> None:
    # seq is unique per job, so a key comparison is decided before the payload or the
    # (unorderable) Job itself could ever be compared.
    a = Job("a", "c", b"zzz", Priority.MEDIUM.level, 1.0, seq=0)
    b = Job("b", "c", b"aaa", Priority.MEDIUM.level, 1.0, seq=1)
    assert a.time_key() < b.time_key()
    assert a.priority_key() < b.priority_key()
    with pytest.raises(TypeError):
        _ = a < b  # type: ignore[operator]


def test_new_job_starts_unattempted_and_live() -> None:
    job = make_job("a", due=1.0, priority=Priority.HIGH, seq=0)
    assert job.attempt == 0
    assert job.cancelled is False


def test_records_pickle_with_the_standard_pickler() -> None:
    job = make_job("a", due=1.5, priority=Priority.HIGH, seq=3)
    lease = Lease(1, "a", "worker-1", 1)
    records: list[object] = [
        lease,
        Assignment(lease, b"payload", 1.5),
        Outcome("a", True, b"result", "", 2.0),
        Priority.LOW,
        Order.PRIORITY,
    ]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record
    copy = pickle.loads(pickle.dumps(job))
    assert (copy.job_id, copy.payload, copy.time_key()) == ("a", job.payload, job.time_key())


def _request(**changes: Any) -> JobRequest:
    return JobRequest("j", "c", b"", 2, 0.0, None)._replace(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"delay": 1e300}, id="delay-past-9999"),
        pytest.param({"delay": None, "at": 1e300}, id="at-past-9999"),
        pytest.param({"delay": None, "at": -1e300}, id="at-before-year-1"),
        pytest.param({"timeout": True}, id="bool-timeout"),
        pytest.param({"timeout": 0}, id="zero-timeout"),
        pytest.param({"retries": -1}, id="negative-retries"),
    ],
)
def test_check_request_rejects_what_cannot_be_represented(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidJobError):
        check_request(_request(**changes))


def test_check_request_accepts_the_last_second_of_9999() -> None:
    check_request(_request(delay=None, at=MAX_EPOCH))
    check_request(_request(delay=3600.0, timeout=1, retries=2))


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"delay": 1e300}, id="delay"),
        pytest.param({"at": 1e300}, id="at"),
        pytest.param({"at": MAX_EPOCH + 1}, id="at-just-past"),
    ],
)
def test_the_client_rejects_overflowing_times_at_the_call_site(kwargs: dict[str, Any]) -> None:
    from mpsched._client.client import Client

    client = Client.__new__(Client)  # validation happens before any manager call
    with pytest.raises(InvalidJobError, match="9999"):
        client.schedule(abs, -1, **kwargs)
