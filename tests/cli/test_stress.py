"""Several producer processes and workers, thousands of jobs: exactly once, none early."""

from __future__ import annotations

import io
import multiprocessing
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import jobs
import pytest

from mpsched._cli.stress import run_stress

pytestmark = pytest.mark.slow

PRODUCERS = 3
JOBS_EACH = 2000


def test_many_producers_and_workers_run_every_job_exactly_once_never_early(
    make_scheduler, tmp_path
):
    s = make_scheduler(workers=4)
    log_path = str(tmp_path / "runs.log")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PRODUCERS, mp_context=ctx) as producers:
        reports = list(
            producers.map(
                jobs.produce,
                [s.address] * PRODUCERS,
                [s.authkey] * PRODUCERS,
                range(PRODUCERS),
                [JOBS_EACH] * PRODUCERS,
                [log_path] * PRODUCERS,
                [2.0] * PRODUCERS,
                timeout=240,
            )
        )
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
    assert stats.queue.started_early == 0


STRESS: dict[str, Any] = {"producers": 2, "workers": 2, "jobs": 600, "horizon": 1.0}


def test_run_stress_passes_and_says_ok() -> None:
    out = io.StringIO()
    assert run_stress(**STRESS, out=out) == 0, out.getvalue()
    report = out.getvalue()
    assert report.splitlines()[-1] == "OK: 600 jobs ran exactly once, none early", report
    for label in (
        "jobs:",
        "producers:",
        "workers:",
        "elapsed:",
        "throughput:",
        "lateness, manager",
        "lateness, producers",
    ):
        assert label in report, report


@pytest.mark.parametrize(
    ("inject", "named"),
    [
        pytest.param("duplicate", "1 duplicated", id="duplicate"),
        pytest.param("loss", "1 lost", id="loss"),
    ],
)
def test_run_stress_verifier_catches_an_injected_fault(inject: str, named: str) -> None:
    out = io.StringIO()
    assert run_stress(**STRESS, inject=inject, out=out) == 1, out.getvalue()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("FAIL:") and named in last, out.getvalue()
    assert "early" not in last and "unresolved" not in last, out.getvalue()


def test_run_stress_uses_a_running_manager(make_scheduler) -> None:
    s = make_scheduler(workers=2)
    out = io.StringIO()
    assert (
        run_stress(
            producers=2,
            workers=99,
            jobs=200,
            horizon=0.5,
            address=s.address,
            authkey=s.authkey,
            out=out,
        )
        == 0
    ), out.getvalue()
    assert "OK: 200 jobs ran exactly once" in out.getvalue()
    assert s.stats().completed == 200


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"jobs": 0}, id="no-jobs"),
        pytest.param({"producers": 0}, id="no-producers"),
        pytest.param({"horizon": -1.0}, id="negative-horizon"),
        pytest.param({"inject": "reorder"}, id="unknown-inject"),
        pytest.param({"address": "/tmp/mpsched.sock"}, id="address-without-authkey"),
    ],
)
def test_run_stress_refuses_bad_arguments(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        run_stress(**{**STRESS, **bad}, out=io.StringIO())


def test_stress_on_a_redis_store_kills_managers_and_every_job_still_runs_once(
    shared_redis, redis_url
):
    from mpsched._cli.stress_shared import run_shared_stress

    out = io.StringIO()
    code = run_shared_stress(
        store=redis_url,
        managers=2,
        producers=2,
        workers=1,
        jobs=1000,
        horizon=2.0,
        kill_every=0.7,
        lease_timeout=1.0,
        out=out,
    )
    text = out.getvalue()
    assert code == 0, text
    assert "OK: 1000 jobs ran exactly once, none early" in text
    kills = re.search(r"(\d+) kills? \(each restarted at once\)", text)
    assert kills is not None and int(kills.group(1)) >= 1, text
