"""The run log of the shared-store tests is read while runs append to it."""

from __future__ import annotations

from pathlib import Path

import shared_jobs


def test_a_log_read_while_a_run_appends_counts_only_whole_lines(tmp_path: Path) -> None:
    # A line that straddles a page reaches the file a page at a time: a reader may see
    # "j3" alone (one read in ~150 did, with two processes appending, on ext4).
    log = tmp_path / "runs.log"
    log.write_text("j1 1.5 10\nj2 2.5 11\nj3")
    assert shared_jobs.runs(str(log)) == [
        shared_jobs.Run("j1", 1.5, 10),
        shared_jobs.Run("j2", 2.5, 11),
    ]
