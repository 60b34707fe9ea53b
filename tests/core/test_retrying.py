"""The retry policy, its back-off and the decision after a failed attempt: pure code."""

from __future__ import annotations

import math
import pickle
from datetime import timedelta

import pytest

from mpsched import InvalidJobError, RetryLater, RetryPolicy
from mpsched._core.job import OutcomeKind
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.recurring import ScheduleKind, ScheduleSpec
from mpsched._core.retrying import (
    RETRY_LATER_BUDGET,
    RetryFilter,
    RetryTerms,
    add_notes,
    backoff,
    coerce_retry,
    error_line,
    retry_delay,
    retry_later_kind,
    with_notes,
)


def test_a_policy_is_a_frozen_picklable_value_with_the_documented_defaults():
    policy = RetryPolicy()
    assert (
        policy.max_retries,
        policy.backoff,
        policy.factor,
        policy.max_backoff,
        policy.jitter,
        policy.on,
        policy.never,
    ) == (3, 1.0, 2.0, 600.0, 0.1, (Exception,), ())
    assert pickle.loads(pickle.dumps(policy)) == policy
    with pytest.raises(AttributeError):
        policy.max_retries = 5  # type: ignore[misc]
    assert RetryPolicy(2, on=KeyError).on == (KeyError,)  # one type alone is taken


@pytest.mark.parametrize(
    "bad",
    [
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"max_retries": True},
        {"backoff": -0.1},
        {"backoff": math.nan},
        {"backoff": math.inf},
        {"backoff": "1"},
        {"max_backoff": -1.0},
        {"max_backoff": 1e300},
        {"backoff": 2e9},
        {"factor": 0.5},
        {"factor": math.nan},
        {"factor": math.inf},
        {"jitter": -0.01},
        {"jitter": 1.5},
        {"jitter": math.nan},
        {"on": (int,)},
        {"on": ("ValueError",)},
        {"never": ValueError("x")},
        {"never": 3},
    ],
    ids=repr,
)
def test_bad_values_raise_invalid_job_error_at_construction(bad):
    with pytest.raises(InvalidJobError) as raised:
        RetryPolicy(**bad)
    assert isinstance(raised.value, ValueError)


def test_the_nth_retry_follows_the_formula_within_its_jitter():
    terms = RetryTerms(max_retries=20, backoff=0.5, factor=3.0, max_backoff=100.0, jitter=0.2)
    for job in ("a", "b", "job-3", "s@2026-01-01T00:00:00Z"):
        for n in range(1, 12):
            base = min(100.0, 0.5 * 3.0 ** (n - 1))
            assert base * 0.8 <= backoff(terms, job, n) <= base * 1.2


def test_jitter_is_fixed_per_job_and_retry_and_spreads_across_jobs():
    terms = RetryPolicy(backoff=10.0, jitter=0.5).terms()
    assert backoff(terms, "j1", 1) == backoff(terms, "j1", 1)  # a restart moves nothing
    spread = {backoff(terms, f"job-{i}", 1) for i in range(200)}
    assert len(spread) == 200
    assert min(spread) < 6.0 and max(spread) > 14.0  # most of [5, 15] is used
    assert backoff(RetryPolicy(backoff=10.0, jitter=0.0).terms(), "j1", 1) == 10.0


def test_a_huge_retry_number_stays_at_max_backoff():
    terms = RetryPolicy(10_000, jitter=0.0).terms()
    assert backoff(terms, "j", 5000) == 600.0


def test_the_budget_of_a_policy_counts_attempts():
    terms = RetryPolicy(2, backoff=1.0, jitter=0.0).terms()
    assert retry_delay("j", 1, terms, OutcomeKind.RETRYABLE) == 1.0
    assert retry_delay("j", 2, terms, OutcomeKind.RETRYABLE) == 2.0
    assert retry_delay("j", 3, terms, OutcomeKind.RETRYABLE) is None
    assert retry_delay("j", 1, terms, OutcomeKind.RAISED) is None
    assert retry_delay("j", 1, None, OutcomeKind.RETRYABLE) is None


def test_retry_later_has_its_own_delay_and_a_budget_of_three_without_a_policy():
    kind = retry_later_kind(RetryLater(timedelta(seconds=2.5), "busy"))
    assert RETRY_LATER_BUDGET == 3
    assert [retry_delay("j", n, None, kind) for n in range(1, 5)] == [2.5, 2.5, 2.5, None]
    terms = RetryPolicy(1).terms()
    assert retry_delay("j", 1, terms, kind) == 2.5
    assert retry_delay("j", 2, terms, kind) is None


def test_retry_later_pickles_shows_its_reason_and_checks_its_delay():
    exc = pickle.loads(pickle.dumps(RetryLater(30, "rate limited by the API")))
    assert (exc.delay, exc.reason, str(exc)) == (
        30.0,
        "rate limited by the API",
        "rate limited by the API",
    )
    assert str(RetryLater(1.5)) == "retry in 1.5 s"
    for bad in (-1, math.nan, "soon", 1e300, timedelta(days=100_000)):
        with pytest.raises(InvalidJobError):
            RetryLater(bad)  # type: ignore[arg-type]


def test_retry_and_retries_together_are_refused():
    assert coerce_retry(None, 2) is None
    assert coerce_retry(4, 0) == RetryPolicy(4)
    with pytest.raises(InvalidJobError, match="not both"):
        coerce_retry(2, 1)
    for bad in ("3", 2.0, True):
        with pytest.raises(InvalidJobError):
            coerce_retry(bad, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "exc", "retried"),
    [
        (RetryPolicy(), ValueError(), True),
        (RetryPolicy(), KeyboardInterrupt(), False),
        (RetryPolicy(), SystemExit(1), False),
        (RetryPolicy(on=(KeyboardInterrupt,)), KeyboardInterrupt(), True),
        (RetryPolicy(on=(OSError,)), ValueError(), False),
        (RetryPolicy(on=(OSError,)), ConnectionError(), True),
        (RetryPolicy(never=(ConnectionError,)), ConnectionError(), False),
        (RetryPolicy(never=(ConnectionError,)), OSError(), True),
    ],
    ids=str,
)
def test_on_and_never_filter_in_the_worker(policy, exc, retried):
    kind = RetryFilter(abs, policy).kind(exc)
    assert (kind == OutcomeKind.RETRYABLE) is retried


def test_notes_travel_after_the_traceback_and_become_the_exception_notes():
    text = with_notes("Traceback...\nValueError: last\n", ["attempt 1 failed: a", "attempt 2: b"])
    assert error_line(text) == "ValueError: last"
    exc = ValueError("last")
    assert add_notes(exc, text) == "Traceback...\nValueError: last\n"
    assert getattr(exc, "__notes__", None) == ["attempt 1 failed: a", "attempt 2: b"]
    assert with_notes("tb", []) == "tb"
    assert error_line("x\n" + "E: " + "y" * 500).endswith("...")


def test_a_schedule_spec_stored_before_retries_existed_loads_without_a_policy():
    spec = ScheduleSpec(
        "s",
        ScheduleKind.EVERY,
        60.0,
        Mode.RATE,
        "",
        "",
        None,
        None,
        0.0,
        Overlap.SKIP,
        Catchup.LATEST,
        OnError.CONTINUE,
        2,
        None,
        3,
        "f",
        b"p",
        RetryPolicy(3).terms(),
    )
    assert ScheduleSpec.of(tuple(spec)) == spec
    before_retries = tuple(spec)[: ScheduleSpec._fields.index("retry")]
    assert ScheduleSpec.of(before_retries) == spec._replace(retry=None)


def test_the_retry_kinds_are_outcome_kinds():
    kinds = (OutcomeKind.RETRYABLE.value, OutcomeKind.RETRY_LATER.value)
    assert kinds == ("retryable", "retry-later")
    assert retry_later_kind(RetryLater(1)).startswith(OutcomeKind.RETRY_LATER + ":")
