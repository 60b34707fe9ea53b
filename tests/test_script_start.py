"""A Scheduler starts from any kind of main module, and nothing re-runs it.

Most programs are plain top-level scripts, without ``if __name__ == "__main__":``; others
have no main file at all (``python -``, ``python -c``, a REPL, a notebook kernel). Each
program below notes its pid in a marker file from its top-level code: the manager and the
workers must never run that code again (multiprocessing's spawn and forkserver children
would), whatever the start method.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from processes import Programs

from mpsched._manager.launcher import REIMPORT_HINT

pytestmark = pytest.mark.slow

METHODS = [pytest.param("forkserver", id="forkserver"), pytest.param("spawn", id="spawn")]
RUN_TIMEOUT = 90.0  # an interpreter, a manager, two workers and their exit, 2 busy cores

# Unguarded, and typed as a REPL takes it: a blank line ends each block.
PROGRAM = """\
import os
from mpsched import Scheduler
with open({marker!r}, "a") as marker:
    marker.write(f"{{os.getpid()}}\\n")

def square(x):
    return x * x

s = Scheduler(workers=2, mp_context={method!r})
print("squares", sorted(s.map(square, range(4))), s.submit(os.getpid).result() != os.getpid())
s.shutdown()
"""
EXPECTED = "squares [0, 1, 4, 9] True"

# What a notebook kernel does with a cell: exec it in a fresh __main__ that has no file.
KERNEL = """\
import sys, types
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
exec(compile(sys.stdin.read(), "<cell 1>", "exec"), main.__dict__)
"""


def _program(tmp_path: Path, method: str) -> tuple[str, Path]:
    marker = tmp_path / "top-level-ran.txt"
    return PROGRAM.format(marker=str(marker), method=method), marker


def _check(out: str, marker: Path, pid: int) -> None:
    assert EXPECTED in out.replace("\r", "").splitlines(), out
    assert marker.read_text().split() == [str(pid)], "the top-level code ran again"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("how", ["script", "stdin", "-c", "notebook"])
def test_an_unguarded_program_starts_a_scheduler(
    programs: Programs, tmp_path: Path, method: str, how: str
) -> None:
    source, marker = _program(tmp_path, method)
    if how == "script":
        args: tuple[str, ...] = (str(programs.script(source)),)
    else:
        args = {"stdin": ("-",), "-c": ("-c", source), "notebook": ("-c", KERNEL)}[how]
    stdin = None if how == "-c" else source
    popen = programs.start(*args, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE)
    out, err = popen.communicate(stdin, timeout=RUN_TIMEOUT)
    assert popen.returncode == 0, err
    assert err == "", err
    _check(out, marker, popen.pid)


@pytest.mark.parametrize("method", METHODS)
def test_a_scheduler_starts_from_the_interactive_interpreter(
    programs: Programs, tmp_path: Path, method: str
) -> None:
    source, marker = _program(tmp_path, method)
    popen, terminal = programs.interactive()
    terminal.type(source + "\nexit()\n")
    out = terminal.read_to_end(RUN_TIMEOUT)
    assert popen.wait(RUN_TIMEOUT) == 0, out
    assert ">>> " in out and "Traceback" not in out, out
    _check(out, marker, popen.pid)


@pytest.mark.parametrize("method", METHODS)
def test_the_manager_leaves_no_temporary_files(
    programs: Programs, tmp_path: Path, method: str
) -> None:
    # Its multiprocessing directory (the forkserver's socket) goes when it exits.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    source, _ = _program(tmp_path, method)
    popen = programs.start(str(programs.script(source)), env={"TMPDIR": str(tmp)})
    _, err = popen.communicate(timeout=RUN_TIMEOUT)
    assert popen.returncode == 0, err
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("method", METHODS)
def test_a_programs_own_pool_that_re_runs_it_gets_one_line(programs: Programs, method: str) -> None:
    # The program's own ProcessPoolExecutor re-runs the unguarded main module in its
    # child: that re-import is the program's choice, and only it can prevent it.
    script = programs.script(f"""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool
        from mpsched import Scheduler

        with Scheduler(workers=1) as s:
            print("scheduler", s.submit(pow, 2, 3).result(), flush=True)
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context({method!r})) as p:
                p.submit(pow, 2, 4).result()
        except BrokenProcessPool:
            print("own pool broken", flush=True)
    """)
    done = programs.run(str(script), timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["scheduler 8", "own pool broken"], done.stdout
    lines = done.stderr.splitlines()
    assert lines and set(lines) == {REIMPORT_HINT}, done.stderr
    assert 'put the top-level code under `if __name__ == "__main__":`' in REIMPORT_HINT


def test_a_scheduler_starts_under_a_temp_directory_too_deep_for_a_socket(
    programs: Programs, tmp_path: Path
) -> None:
    # The forkserver's socket goes in a directory of TMPDIR's; under a deep TMPDIR its path
    # passed the 107 bytes a Unix socket's may have, and the manager could not start.
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    source, _ = _program(tmp_path, "forkserver")
    popen = programs.start(str(programs.script(source)), env={"TMPDIR": str(deep)})
    out, err = popen.communicate(timeout=RUN_TIMEOUT)
    assert popen.returncode == 0, err
    assert EXPECTED in out.replace("\r", "").splitlines(), out
