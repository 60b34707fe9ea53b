"""A job whose module only the client has: the worker's error says what to do about it."""

from __future__ import annotations

import importlib
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import cloudpickle
import pytest

from mpsched import JobUnpicklingError, Scheduler

pytestmark = pytest.mark.slow

MODULE = "only_in_the_client"


def test_a_job_from_a_module_only_the_client_has_fails_saying_what_to_do(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_scheduler(workers=1)  # its processes started before tmp_path joins sys.path
    (tmp_path / f"{MODULE}.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)  # forgotten again after the test

    error = s.submit(module.triple, 2).exception(timeout=30)
    assert isinstance(error, JobUnpicklingError), error
    message = str(error)
    assert f"No module named '{MODULE}'" in message
    assert "working directory and PYTHONPATH" in message
    assert "__main__ and lambdas travel by value" in message
    assert "cloudpickle.register_pickle_by_value(module)" in message
    [worker] = s.stats().workers  # which worker could not import it, and where it looked
    assert f"the worker on {socket.gethostname()} (pid {worker.pid}) could not" in message
    assert "this worker's sys.path: [" in message and str(tmp_path) not in message
    assert "submit --by-value MODULE" in message  # what a command-line user can do

    cloudpickle.register_pickle_by_value(module)  # the advice works
    try:
        assert s.submit(module.triple, 2).result(timeout=30) == 6
    finally:
        cloudpickle.unregister_pickle_by_value(module)
