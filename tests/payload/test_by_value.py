"""A function of the main script is pickled by value once, and again when it may differ."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from mpsched._payload import by_value as _by_value
from mpsched._payload.by_value import pickled_by_value


def main_script(source: str) -> dict[str, Any]:
    """The namespace of a main script that ran ``source``."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "/somewhere/script.py", "exec"), namespace)
    return namespace


def run(pickled: bytes | None) -> Any:
    assert pickled is not None
    return cloudpickle.loads(pickled)()


@pytest.fixture
def pickles(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every function pickled by value from now on."""
    made: list[object] = []
    real = _by_value.cloudpickle_dumps

    def counting(obj: Any, *args: Any) -> bytes:
        made.append(obj)
        return real(obj, *args)

    monkeypatch.setattr(_by_value, "cloudpickle_dumps", counting)
    return made


def test_a_function_reading_only_fixed_values_is_pickled_once(pickles: list[object]) -> None:
    script = main_script(
        "import math\nLIMIT = 10\nNAMES = ('a', 'b')\n"
        "def job(n=2):\n    return math.sqrt(LIMIT * n), NAMES, len(NAMES)\n"
    )
    first = pickled_by_value(script["job"])
    assert pickled_by_value(script["job"]) is first and len(pickles) == 1
    assert run(first) == (20**0.5, ("a", "b"), 2)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param("LIMIT = 11", id="a global rebound"),
        pytest.param("job.__defaults__ = (3,)", id="defaults"),
        pytest.param("job.__code__ = other.__code__", id="code"),
        pytest.param("def helper(): return 7\nLIMIT = helper()", id="a value computed later"),
    ],
)
def test_a_change_to_what_it_is_made_of_pickles_it_again(
    pickles: list[object], change: str
) -> None:
    script = main_script(
        "LIMIT = 10\ndef job(n=2):\n    return LIMIT * n\ndef other(n=2):\n    return -LIMIT * n\n"
    )
    before = run(pickled_by_value(script["job"]))
    exec(change, script)
    after = pickled_by_value(script["job"])
    assert len(pickles) == 2 and run(after) != before
    assert run(after) == script["job"]()  # what a fresh pickle would run


def test_a_global_defined_after_the_first_pickle_is_in_the_next(pickles: list[object]) -> None:
    script = main_script("def job():\n    return FACTOR * 2\n")
    with pytest.raises(NameError):
        run(pickled_by_value(script["job"]))
    script["FACTOR"] = 21
    assert run(pickled_by_value(script["job"])) == 42


def test_a_closure_is_pickled_again_when_its_cell_changes(pickles: list[object]) -> None:
    script = main_script(
        "def make():\n    step = 1\n    def job():\n        return step\n"
        "    def bump():\n        nonlocal step\n        step += 1\n"
        "    return job, bump\njob, bump = make()\n"
    )
    assert run(pickled_by_value(script["job"])) == 1
    script["bump"]()
    assert run(pickled_by_value(script["job"])) == 2 and len(pickles) == 2


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("CONFIG = {'x': 1}\ndef job():\n    return CONFIG['x']\n", id="a dict"),
        pytest.param("SEEN = []\ndef job(seen=SEEN):\n    return len(seen)\n", id="a list default"),
        pytest.param(
            "class Point:\n    pass\ndef job():\n    return Point\n", id="a class of the script"
        ),
        pytest.param(
            "def helper():\n    return 1\ndef job():\n    return helper()\n",
            id="another function of the script",
        ),
        pytest.param("def job():\n    return job.calls\njob.calls = 0\n", id="an attribute"),
        pytest.param("def job(*, n=1):\n    return n\n", id="keyword defaults"),
    ],
)
def test_a_function_made_of_anything_mutable_is_not_kept(source: str) -> None:
    assert pickled_by_value(main_script(source)["job"]) is None


def test_only_plain_functions_of_the_main_script_are_kept() -> None:
    assert pickled_by_value(os.path.join) is None  # importable: pickled by reference
    assert pickled_by_value(len) is None
    lam: Callable[[], int] = main_script("job = lambda: 3\n")["job"]
    assert run(pickled_by_value(lam)) == 3


def test_a_module_imported_later_pickles_it_again(pickles: list[object]) -> None:
    script = main_script("import os\ndef job():\n    return os.sep\n")
    pickled_by_value(script["job"])
    # sys.modules grew: its pickle may name submodules imported since.
    sys.modules["mpsched_test_imported_later"] = types.ModuleType("imported_later")
    try:
        pickled_by_value(script["job"])
    finally:
        del sys.modules["mpsched_test_imported_later"]
    assert len(pickles) == 2


# Submits a job of the script, rebinds and mutates what it reads, submits again.
SCRIPT = """
import mpsched
LIMIT = 1
CONFIG = {"x": 1}
def limit():
    return LIMIT
def config():
    return CONFIG["x"]
with mpsched.Scheduler(workers=1) as s:
    before = s.submit(limit).result(), s.submit(config).result()
    LIMIT = 2
    CONFIG["x"] = 2
    print(before, (s.submit(limit).result(), s.submit(config).result()))
"""


@pytest.mark.slow
def test_jobs_of_a_script_see_what_their_globals_are_at_each_submit(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(1, 1) (2, 2)\n"
