"""The runnable examples: each one runs as its own program, exits 0 and says it checked out."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import Lines, Programs, wait_for

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
README = EXAMPLES.parent / "README.md"
RUN_TIMEOUT = 60.0  # each example finishes in about 5 s on 2 cores

CASES = [
    pytest.param(
        "three_waves.py", ["wave 3  job", "✓ every wave started on time"], id="three_waves"
    ),
    pytest.param("strict_order.py", ["✓ exactly time → priority → FIFO"], id="strict_order"),
    pytest.param(
        "cpu_speedup.py", ["speed-up:", "✓ every job found 17,984 primes"], id="cpu_speedup"
    ),
    pytest.param(
        "durable_jobs.py",
        ["6 jobs recovered from the store", "✓ every report ran exactly once, after the restart"],
        id="durable_jobs",
    ),
    pytest.param(
        "recurring.py",
        ["tick@", "0 overlaps", "nightly 02:30 in Berlin:", "✓ on its slots, no drift, no overlap"],
        id="recurring",
    ),
    pytest.param(
        "pipeline.py",
        [
            "17,984 primes below 200,000",
            "✓ 8 transforms ran in parallel",
            "✓ nothing was left waiting after the failure",
        ],
        id="pipeline",
    ),
    pytest.param(
        "retries.py",
        [
            "page-3: 200 OK after 4 runs",
            "  attempt 3 failed at",
            "✓ every job ran exactly as often as it had to",
        ],
        id="retries",
    ),
]


@pytest.mark.parametrize(("script", "phrases"), CASES)
def test_example_runs_and_checks_out(script: str, phrases: list[str]) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # the examples print ✓ and →
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        encoding="utf-8",
        env=env,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    output = f"--- stdout\n{completed.stdout}--- stderr\n{completed.stderr}"
    assert completed.returncode == 0, output
    for phrase in phrases:
        assert phrase in completed.stdout, output
    assert "Traceback" not in completed.stderr, output


def test_the_readme_first_example_runs_as_a_script_as_pasted(programs: Programs) -> None:
    text = README.read_text()
    start = text.index("```python\n") + len("```python\n")
    block = text[start : text.index("```", start)]
    # The block says what its first print prints, in a comment.
    promised = re.search(r"^\s*print\(f\.result\(\).*#\s*(.+)$", block, re.MULTILINE)
    assert promised, block
    done = programs.run(str(programs.script(block, "readme_example.py")), timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == promised.group(1).strip(), done.stdout


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGTERM (Linux: SigCgt)."""
    status = Path(f"/proc/{pid}/status").read_text()
    [mask] = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_readme_recurring_example_keeps_running_until_sigterm(programs: Programs) -> None:
    text = README.read_text()
    start = text.index("```python\n", text.index("### Recurring jobs")) + len("```python\n")
    block = text[start : text.index("```", start)]
    popen = programs.start(str(programs.script(block, "recurring_readme.py")))
    assert popen.stdout is not None and popen.stderr is not None
    out, err = Lines(popen.stdout), Lines(popen.stderr)
    printed = out.next(RUN_TIMEOUT)  # next_run, preview(3) and counters
    assert "Europe/Berlin" in printed, printed
    # run_forever() waits with its SIGTERM handler set: the script keeps running.
    wait_for(
        lambda: popen.poll() is not None or _catches_sigterm(popen.pid),
        RUN_TIMEOUT,
        "run_forever() waiting",
    )
    assert popen.poll() is None, err.rest()
    os.kill(popen.pid, signal.SIGTERM)
    assert popen.wait(RUN_TIMEOUT) == 0, err.rest()
    assert err.rest() == []  # a store keeps the schedules: no warning
