"""The three-waves demo as a function: ``run_demo(out)`` prints to ``out`` and returns 0."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from mpsched import Scheduler
from mpsched._cli.demo import JobRun, check, print_runs, run_demo, warm_up

pytestmark = pytest.mark.slow

ORIGIN = 1000.0  # wave n is due at ORIGIN + n


def test_run_demo_checks_out_and_prints_only_to_its_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    assert run_demo(out) == 0, out.getvalue()
    report = out.getvalue()
    assert "wave 3  job" in report, report
    assert "✓ every wave was handed out in heap order" in report, report
    assert report.splitlines()[-1].startswith("✓ every wave started on time"), report
    assert capsys.readouterr().out == ""


def wave_one(*starts: tuple[int, str, float]) -> list[JobRun]:
    """Jobs of wave 1 (job ids 0, 10, 20, 30), each starting ``ms`` after its due time."""
    return [
        JobRun(job_id, priority, 100 + job_id, ORIGIN + 1 + ms / 1000)
        for job_id, priority, ms in starts
    ]


def test_rows_are_in_hand_out_order_whatever_order_concurrent_jobs_started_in() -> None:
    # The three jobs that found a free worker began within 0.2 ms of each other, MEDIUM
    # first: the manager handed out both HIGH jobs before it all the same.
    runs = wave_one((10, "MEDIUM", 0.1), (30, "HIGH", 0.2), (0, "HIGH", 0.3), (20, "LOW", 100.5))
    out = io.StringIO()
    waves = print_runs(runs, ORIGIN, out)
    rows = [line.split()[4] for line in out.getvalue().splitlines() if line.startswith("wave")]
    assert rows == ["HIGH", "HIGH", "MEDIUM", "LOW"], out.getvalue()
    assert "waited for a free worker" in out.getvalue().splitlines()[-1]
    assert check([waves[0]], ORIGIN) == ([], [])


def test_check_catches_a_wave_started_out_of_hand_out_order() -> None:
    # LOW started with the first three and a HIGH job waited for a free worker.
    runs = wave_one((10, "MEDIUM", 0.1), (20, "LOW", 0.2), (0, "HIGH", 0.3), (30, "HIGH", 100.5))
    waves = print_runs(runs, ORIGIN, io.StringIO())
    disorder, late = check([waves[0]], ORIGIN)
    assert disorder == [
        "wave 1: started ['MEDIUM', 'LOW', 'HIGH', 'HIGH'], handed out "
        "['HIGH', 'HIGH', 'MEDIUM', 'LOW']"
    ]
    assert late == []


def test_warm_up_runs_a_job_on_every_worker(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(workers=3)
    warm_up(s)
    workers = s.stats().workers
    assert len(workers) == 3 and all(w.jobs_done >= 1 for w in workers), workers
