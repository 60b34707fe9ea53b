"""``submit --retry N --backoff S`` on a real serve process; what ``jobs``, the JSON API
and the metrics show of a job that waits for its retry."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import retry_jobs
from processes import wait_for
from served import Processes, serve

from mpsched._cli.main import main
from mpsched._protocol.records import Exit

pytestmark = pytest.mark.slow
TOKEN = "retry-page-token"


def get(url: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(answer.read().decode())


def test_submit_retry_runs_the_budget_with_back_off_and_jobs_shows_the_last_error(
    procs: Processes, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    manager = serve(
        procs, "--workers", "1", "--http", "127.0.0.1:0", "--http-token-file", str(token)
    )
    lines = [manager.proc.line() for _ in range(3)]  # status, store, page
    page = re.search(r"page:\s+(http://127\.0\.0\.1:\d+/)", lines[2])
    assert page, lines
    log = str(tmp_path / "starts.log")
    failed = procs.run(
        "submit",
        "retry_jobs:always_fail",
        "--args",
        json.dumps([log]),
        "--retry",
        "2",
        "--backoff",
        "0.1",
        "--wait",
        *manager.cli(),
    )
    assert failed.returncode == Exit.FAILURE, failed.stderr
    assert "ValueError: boom 3" in failed.stderr
    starts = retry_jobs.starts(log)
    assert len(starts) == 3
    assert starts[1] - starts[0] >= 0.09 and starts[2] - starts[1] >= 0.18

    later_log = str(tmp_path / "later.log")
    waiting = procs.run(
        "submit",
        "retry_jobs:later",
        "--args",
        json.dumps([later_log, 600, "rate limited by the API"]),
        *manager.cli(),
    )
    job_id = waiting.stdout.strip()
    wait_for(lambda: len(retry_jobs.starts(later_log)) == 1, what="the first run")

    def listed() -> dict[str, object]:
        shown = procs.run("jobs", "--json", "--state", "pending", *manager.cli())
        return {job["job_id"]: job for job in json.loads(shown.stdout)}.get(job_id, {})

    wait_for(lambda: listed().get("attempts") == 1, what="the job pending for its retry")
    assert listed()["error"] == "mpsched.RetryLater: rate limited by the API"
    table = procs.run("jobs", "--state", "pending", *manager.cli()).stdout
    [row] = [line for line in table.splitlines() if line.startswith(job_id)]
    assert re.search(r" 1 +- +- +mpsched\.RetryLater: rate limited by the API$", row), row

    reason = "mpsched.RetryLater: rate limited by the API"
    [api] = [
        j
        for j in json.loads(get(page.group(1) + "api/jobs?state=pending"))
        if j["job_id"] == job_id
    ]
    assert (api["attempts"], api["error"]) == (1, reason)
    [shown] = [
        j
        for j in json.loads(get(page.group(1) + "api/dashboard"))["pending"]
        if j["job_id"] == job_id
    ]
    assert (shown["attempts"], shown["error"]) == (1, reason)
    metrics = get(page.group(1) + "metrics")
    assert 'mpsched_jobs_retried_total{cause="exception"} 2' in metrics
    assert 'mpsched_jobs_retried_total{cause="retry_later"} 1' in metrics
    assert 'mpsched_jobs_retried_total{cause="crash"} 0' in metrics
    status = procs.run("status", *manager.cli()).stdout
    assert re.search(r"  retried 3  ", status), status  # 2 after exceptions, 1 asked for
    assert procs.run("cancel", job_id, *manager.cli()).returncode == Exit.OK


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backoff", "2"], "--backoff needs --retry"),
        (["--retry", "-1"], "max_retries"),
        (["--retry", "2", "--retries", "1"], "not both"),
        (["--retry", "2", "--backoff", "nan"], "backoff"),
    ],
    ids=["backoff-alone", "negative", "with-retries", "nan-backoff"],
)
def test_submit_refuses_bad_retry_options_as_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "submit",
                "math:factorial",
                "--args",
                "[3]",
                *argv,
                "--connect",
                "unix:/nonexistent/socket",
            ]
        )
        == Exit.USAGE
    )
    assert message in capsys.readouterr().err
