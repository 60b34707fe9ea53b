"""The seed demo as a function: ``run_demo(out)`` prints to ``out`` and returns 0."""

from __future__ import annotations

import io

import pytest

from mpsched._demo import run_demo

pytestmark = pytest.mark.slow


def test_run_demo_checks_out_and_prints_only_to_its_stream(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert run_demo(out) == 0, out.getvalue()
    report = out.getvalue()
    assert "wave 3  job" in report, report
    assert report.splitlines()[-1].startswith("✓ every wave started on time"), report
    assert capsys.readouterr().out == ""
