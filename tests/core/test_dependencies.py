"""The dependency graph and ResultOf's substitution, without processes."""

from __future__ import annotations

import pickle

import pytest

from mpsched._core.dependencies import DependencyGraph, Failed, Released
from mpsched._core.job import After, Job, Outcome
from mpsched._core.result_of import (
    ResultOf,
    attach_inputs,
    detach_inputs,
    job_payload,
    result_parents,
    substitute,
)
from mpsched._errors import InvalidJobError


def job(job_id: str) -> Job:
    return Job(
        job_id=job_id, client_id="c", payload=b"p-" + job_id.encode(), priority=2, due=0.0, seq=0
    )


def ok(job_id: str, value: bytes = b"r") -> Outcome:
    return Outcome(job_id, True, value, "", None)


def failed(job_id: str) -> Outcome:
    return Outcome(job_id, False, b"", "Traceback...\nValueError: no\n", None)


def test_the_last_parents_end_releases_a_child_with_the_results_it_takes():
    graph = DependencyGraph()
    assert graph.add(job("d"), After(("b", "c"), ("b",)), ["b", "c"], {}) is None
    assert graph.remaining("d") == 2 and graph
    assert graph.ended("b", ok("b", b"rb")) == []
    [released] = graph.ended("c", ok("c"))
    assert isinstance(released, Released) and released.job.job_id == "d"
    assert released.inputs == {"b": ok("b", b"rb")}
    assert not graph and len(graph) == 0


def test_a_failed_parent_fails_the_child_unless_it_allows_failure():
    graph = DependencyGraph()
    graph.add(job("x"), After(("a",), ()), ["a"], {})
    graph.add(job("y"), After(("a",), ("a",), allow_failure=True), ["a"], {})
    verdicts = graph.ended("a", failed("a"))
    assert [type(v) for v in verdicts] == [Failed, Released]
    assert isinstance(verdicts[0], Failed) and verdicts[0].parent_outcome == "ValueError: no"
    assert isinstance(verdicts[1], Released) and verdicts[1].inputs == {"a": failed("a")}


def test_parents_that_ended_before_count_at_once():
    graph = DependencyGraph()
    verdict = graph.add(job("x"), After(("a",), ("a",)), [], {"a": ok("a")})
    assert isinstance(verdict, Released) and verdict.inputs == {"a": ok("a")}
    verdict = graph.add(job("y"), After(("a", "b"), ()), ["b"], {"a": failed("a")})
    assert isinstance(verdict, Failed) and "y" not in graph


def test_a_removed_child_is_skipped_when_its_parent_ends():
    graph = DependencyGraph()
    graph.add(job("x"), After(("a",), ()), ["a"], {})
    assert graph.remove("x") is not None
    assert graph.ended("a", ok("a")) == []


def test_result_of_is_found_and_substituted_at_the_top_and_one_level_in():
    a, b = ResultOf("a"), ResultOf("b")
    args = (a, [a, 1, b], (b,), {"k": a}, 5)
    kwargs = {"x": b, "y": [1]}
    assert result_parents(args, kwargs) == ["a", "b"]
    new_args, new_kwargs = substitute(args, kwargs, {"a": 10, "b": 20})
    assert new_args == (10, [10, 1, 20], (20,), {"k": 10}, 5)
    assert new_kwargs == {"x": 20, "y": [1]}
    assert pickle.loads(pickle.dumps(a)).job_id == "a"
    with pytest.raises(InvalidJobError):
        ResultOf("")


def test_inputs_travel_in_front_of_the_payload():
    payload = b"the job"
    assert detach_inputs(payload) == ({}, payload) and job_payload(payload) is payload
    wrapped = attach_inputs(payload, {"a": ok("a", b"ra")})
    assert job_payload(wrapped) == payload
    assert detach_inputs(wrapped) == ({"a": ok("a", b"ra")}, payload)
