"""How ``jobs`` shows a job's progress and error: a percentage, compact JSON cut to fit,
the error line last."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from mpsched import JobInfo, Priority
from mpsched._cli.jobs import format_jobs, format_progress, job_as_dict


def info(progress: Any = None, error: str | None = None) -> JobInfo:
    return JobInfo(
        job_id="a-1",
        name="mymod.crunch",
        state="running",
        due=datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc),
        priority=Priority.LOW,
        attempts=1,
        worker="w1",
        key=None,
        error=error,
        progress=progress,
    )


def test_progress_shows_as_a_percentage_or_compact_json_cut_to_fit() -> None:
    assert format_progress(None) == "-"
    assert format_progress(0.425) == "42%" and format_progress(1.0) == "100%"
    assert format_progress({"rows": 3, "of": 10}) == '{"rows":3,"of":10}'
    long = format_progress({"text": "x" * 100})
    assert len(long) == 40 and long.endswith("...")


def test_the_table_and_json_show_progress_and_the_error() -> None:
    now = datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc).timestamp()
    row = format_jobs([info(0.5, "ValueError: boom")], now).splitlines()[1]
    assert row.split()[-4:] == ["w1", "50%", "ValueError:", "boom"]
    shown = json.loads(json.dumps(job_as_dict(info({"rows": 3}), now)))
    assert shown["progress"] == {"rows": 3} and shown["error"] is None
