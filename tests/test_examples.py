"""The runnable examples: each one runs as its own program, exits 0 and says it checked out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from processes import Programs

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
README = EXAMPLES.parent / "README.md"
RUN_TIMEOUT = 60.0  # each example finishes in about 5 s on 2 cores

CASES = [
    pytest.param("seed_demo.py", ["wave 3  job", "✓ every wave started on time"],
                 id="seed_demo"),
    pytest.param("strict_order.py", ["✓ exactly time → priority → FIFO"], id="strict_order"),
    pytest.param("cpu_speedup.py", ["speed-up:", "✓ every job found 17,984 primes"],
                 id="cpu_speedup"),
    pytest.param("durable_jobs.py", ["6 jobs recovered from the store",
                                     "✓ every report ran exactly once, after the restart"],
                 id="durable_jobs"),
    pytest.param("recurring.py", ["tick@", "0 overlaps", "nightly 02:30 in Berlin:",
                                  "✓ on its slots, no drift, no overlap"], id="recurring"),
]


@pytest.mark.parametrize(("script", "phrases"), CASES)
def test_example_runs_and_checks_out(script: str, phrases: list[str]) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # the examples print ✓ and →
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True, encoding="utf-8", env=env, timeout=RUN_TIMEOUT, check=False,
    )
    output = f"--- stdout\n{completed.stdout}--- stderr\n{completed.stderr}"
    assert completed.returncode == 0, output
    for phrase in phrases:
        assert phrase in completed.stdout, output
    assert "Traceback" not in completed.stderr, output


def test_the_readme_first_example_runs_as_a_script_as_pasted(programs: Programs) -> None:
    text = README.read_text()
    start = text.index("```python\n") + len("```python\n")
    block = text[start:text.index("```", start)]
    # The block says what its first print prints, in a comment.
    promised = re.search(r"^\s*print\(f\.result\(\).*#\s*(.+)$", block, re.MULTILINE)
    assert promised, block
    done = programs.run(str(programs.script(block, "readme_example.py")), timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == promised.group(1).strip(), done.stdout
