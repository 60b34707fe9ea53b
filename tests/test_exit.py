"""Interpreter exit without shutdown(): nothing already due is lost, nothing later is silent.

Each test runs a real script in its own interpreter, as a user's program would end.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TESTS_DIR = Path(__file__).parent
SCRIPT_TIMEOUT = 90.0  # a whole interpreter start, manager, workers and exit, 2 busy cores


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(body)
    )
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        cwd=tmp_path,
    )


def test_due_jobs_run_to_completion_when_the_program_just_ends(tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    done = run_script(
        tmp_path,
        f"""
        import jobs
        from mpsched import Scheduler

        s = Scheduler(workers=1)
        for key in ("a", "b", "c"):
            s.submit(jobs.record, {str(log)!r}, key)
        s.schedule(jobs.record, {str(log)!r}, "later", delay=600)
    """,
    )
    assert done.returncode == 0, done.stderr
    assert log.read_text().split() == ["a", "b", "c"]
    warnings = [line for line in done.stderr.splitlines() if "dropped" in line]
    assert len(warnings) == 1, done.stderr
    assert "dropped 1 job(s) not yet due" in warnings[0]
    assert "shutdown(wait=True)" in warnings[0]
    assert "could not send" not in done.stderr


def test_a_submit_after_exit_began_is_refused_with_the_stdlib_words(tmp_path: Path) -> None:
    done = run_script(
        tmp_path,
        """
        import atexit
        import jobs
        from mpsched import Scheduler, SchedulerShutdownError

        def late_submit():
            try:
                s.submit(jobs.noop, 1)
            except SchedulerShutdownError as exc:
                print("refused:", exc, flush=True)
            else:
                print("accepted", flush=True)

        s = Scheduler(workers=1)
        atexit.register(late_submit)
        print("result:", s.submit(jobs.noop, 5).result(timeout=60), flush=True)
    """,
    )
    assert done.returncode == 0, done.stderr
    result, refused = done.stdout.splitlines()
    assert result == "result: 5"
    assert refused.startswith("refused: cannot schedule new futures after shutdown")


def test_a_connected_client_sends_what_it_submitted_before_exit(tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    done = run_script(
        tmp_path,
        f"""
        import subprocess, sys, jobs
        from mpsched import Scheduler

        with Scheduler(workers=1) as s:
            key = s.authkey.hex()
            code = (
                "import sys; sys.path.insert(0, {str(TESTS_DIR)!r}); import jobs, mpsched; "
                f"c = mpsched.connect({{s.address!r}}, authkey=bytes.fromhex({{key!r}})); "
                "[c.submit(jobs.record, {str(log)!r}, str(n), pad=bytes(20_000)) "
                "for n in range(2000)]")
            subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
            s.submit(jobs.record, {str(log)!r}, "last").result(timeout=60)
    """,
    )
    assert done.returncode == 0, done.stderr
    lines = log.read_text().split()
    assert sorted(lines[:-1], key=int) == [str(n) for n in range(2000)]
    assert lines[-1] == "last"


def test_a_job_watched_by_id_does_not_hold_the_exit(tmp_path: Path) -> None:
    done = run_script(
        tmp_path,
        """
        import jobs, mpsched
        from mpsched import Scheduler

        s = Scheduler(workers=1)
        other = mpsched.connect(s.address, authkey=s.authkey)
        theirs = other.schedule(jobs.noop, 1, delay=600)  # another client's job
        other.stats()
        watched = s.job(theirs.job_id)
        print("watching", flush=True)
    """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["watching"]


def test_with_a_store_jobs_due_later_stay_for_the_next_scheduler(tmp_path: Path) -> None:
    log, store = tmp_path / "ran.log", tmp_path / "jobs.db"
    first = run_script(
        tmp_path,
        f"""
        import jobs
        from mpsched import Scheduler

        s = Scheduler(workers=1, store={str(store)!r})
        s.submit(jobs.record, {str(log)!r}, "now")
        later = s.schedule(jobs.record, {str(log)!r}, "later", delay=600)
        print(later.job_id, flush=True)
    """,
    )
    assert first.returncode == 0, first.stderr
    assert "1 job(s) not yet due stay pending in the store" in first.stderr
    assert log.read_text().split() == ["now"]
    [later_id] = first.stdout.split()
    second = run_script(
        tmp_path,
        f"""
        from mpsched import Scheduler

        with Scheduler(workers=1, store={str(store)!r}) as s:
            print(*[j.job_id for j in s.jobs(state="pending")], flush=True)
            s.shutdown(cancel_futures=True)
    """,
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == [later_id]
