"""CPython's own concurrent.futures tests, ported to run against Scheduler.

Ported from Lib/test/test_concurrent_futures/ (executor.py, test_as_completed.py,
test_wait.py, test_shutdown.py, and the generic parts of test_process_pool.py), rewritten
for pytest and our API. Jobs live in tests/contract_jobs.py; a *gate* there stands in for
the multiprocessing Event the originals block jobs on. Timings are shortened, never
tightened: each job that waits does so on a gate or a fifo, not on a guess.

Where Scheduler deliberately differs, the test asserts our documented behaviour and says
so (look for "Differs:"):
- ``Future.running()`` stays False: the manager reports outcomes, not starts;
- map()'s ``chunksize`` is validated as ProcessPoolExecutor does, then ignored;
- a worker that dies fails only its own job (WorkerCrashedError), nothing else breaks:
  there is no BrokenProcessPool;
- a Scheduler that is dropped stops its manager: jobs already running finish, jobs not
  yet started are not run (their futures fail with SchedulerShutdownError); the stdlib
  executors run them all first. At interpreter exit, as in the stdlib, every job already
  due runs first; jobs due later are dropped with a warning (tests/test_exit.py);
- submit after shutdown raises SchedulerShutdownError, which is the RuntimeError the
  stdlib raises, with the stdlib's wording.

Not ported, and why:
- the stdlib's ThreadPool- and InterpreterPool-only tests, and the "fork" start method:
  Scheduler refuses fork (its processes run threads);
- tests that read ProcessPoolExecutor's private state: test_saturation,
  test_idle_process_reuse_one/multiple (``_processes``),
  test_max_tasks_per_child_defaults_to_spawn_context (``_mp_context``; our default is
  forkserver, documented), and the process counts of test_processes_terminate (the rest
  of that test is ported);
- tests that patch the pool's internals: test_python_finalization_error,
  test_force_shutdown_during_max_tasks_worker_exit,
  test_failed_worker_replacement_breaks_pool, and terminate_workers()/kill_workers()
  (an API of Python 3.14's ProcessPoolExecutor that Scheduler does not have);
- test_broken_process_pool_traceback: it checks the BrokenProcessPool that every pending
  future gets when one worker dies; here one crash touches one future (see
  test_a_killed_worker_fails_only_its_job);
- test_free_reference_yielded_future and the premade-futures half of
  test_correct_timeout_exception_msg: they drive as_completed() with bare Futures and no
  executor, so they test the stdlib, not us (the second is ported with our futures);
- test_deadlock.py (crashes while pickling or unpickling tasks and results): each of
  those is a typed error of its own future here, covered by test_faults.py and
  test_scheduler.py; test_init.py: Scheduler has no ``initializer``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import contract_jobs as cj
import jobs
import pytest
from processes import assert_gone, wait_started

from mpsched import (
    ConfigError,
    RemoteTraceback,
    Scheduler,
    SchedulerShutdownError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.slow

WORKERS = 3  # the shared scheduler's; the stdlib runs these tests with 5
WAIT = 60.0  # a bound for what must happen, far above what it takes
TESTS = Path(__file__).parent


# ----------------------------------------------------------------------------- helpers


def _future(state: str) -> Future[Any]:
    """A bare Future in ``state``, built through the public API only."""
    future: Future[Any] = Future()
    if state == "running":
        future.set_running_or_notify_cancel()
    elif state in ("cancelled", "cancelled_and_notified"):
        future.cancel()
        if state == "cancelled_and_notified":
            future.set_running_or_notify_cancel()
    elif state == "exception":
        future.set_exception(OSError())
    elif state == "successful":
        future.set_result(42)
    return future


PENDING_FUTURE = _future("pending")
RUNNING_FUTURE = _future("running")
CANCELLED_FUTURE = _future("cancelled")
CANCELLED_AND_NOTIFIED_FUTURE = _future("cancelled_and_notified")
EXCEPTION_FUTURE = _future("exception")
SUCCESSFUL_FUTURE = _future("successful")


def _stop(scheduler: Scheduler) -> None:
    scheduler.shutdown(wait=False, cancel_futures=True)
    scheduler._finalizer()
    if scheduler._closing.closer is not None:
        scheduler._closing.closer.join(30)


@pytest.fixture(scope="module")
def executor() -> Iterator[Scheduler]:
    """One Scheduler for the tests that leave it running, as the stdlib's executor."""
    scheduler = Scheduler(workers=WORKERS)
    yield scheduler
    _stop(scheduler)


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[str]:
    """A gate jobs wait at (contract_jobs.wait_gate); opened at the end in any case, so
    no job of a failed test keeps a shared worker."""
    path = str(tmp_path / "gate")
    os.mkfifo(path)
    yield path
    cj.open_gate(path)


class Listener:
    """The test's end of a fifo that jobs write lines to (contract_jobs.say)."""

    def __init__(self, path: str) -> None:
        os.mkfifo(path)
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        # Our own writer: with it open the fifo never reports end-of-file between the
        # jobs' writes, so select() wakes only for data.
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self._buffer = b""

    def line(self, timeout: float = WAIT) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no line on {self.path} in {timeout} s"
            if select.select([self._fd], [], [], remaining)[0]:
                self._buffer += os.read(self._fd, 4096)
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        os.close(self._keep)
        os.close(self._fd)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    lst = Listener(str(tmp_path / "said.fifo"))
    yield lst
    lst.close()


def process_ids(scheduler: Scheduler) -> list[int]:
    """The manager's pid and its workers'."""
    return [scheduler._manager_process.pid or 0] + [w.pid for w in scheduler.stats().workers]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=env,
        cwd=str(TESTS),
    )


# ------------------------------------------------------------------- executor.py


def test_submit(executor):
    assert executor.submit(pow, 2, 8).result(WAIT) == 256


def test_submit_keyword(executor):
    assert executor.submit(cj.mul, 2, y=8).result(WAIT) == 16
    future = executor.submit(cj.capture, 1, self=2, fn=3)
    assert future.result(WAIT) == ((1,), {"self": 2, "fn": 3})
    with pytest.raises(TypeError):
        executor.submit(fn=cj.capture, arg=1)
    with pytest.raises(TypeError):
        executor.submit(arg=1)


def test_map(executor):
    expected = list(map(pow, range(10), range(10)))
    assert list(executor.map(pow, range(10), range(10))) == expected
    # Differs: chunksize is accepted and ignored; each item is its own job.
    assert list(executor.map(pow, range(10), range(10), chunksize=3)) == expected


def test_map_exception(executor):
    results = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5])
    assert next(results) == (0, 1)
    assert next(results) == (0, 1)
    with pytest.raises(ZeroDivisionError):
        next(results)


def test_map_timeout(executor, gate):
    # The original sleeps 6 s under a 5 s timeout; here the third job waits at a gate.
    results = []
    with pytest.raises(futures.TimeoutError):
        for result in executor.map(cj.pause, [None, None, gate], timeout=2):
            results.append(result)
    assert results == [None, None]


def test_shutdown_race_issue12456(make_scheduler):
    s = make_scheduler(workers=2)
    s.map(str, [2] * (2 + 1))
    s.shutdown()


def test_no_stale_references(executor):
    # The job is pickled at the call site: nothing of ours keeps the callable alive.
    my_object = cj.MyObject()
    collected = threading.Event()
    _ref = weakref.ref(my_object, lambda _: collected.set())
    executor.submit(my_object.my_method)  # the future is discarded on purpose
    del my_object
    gc.collect()
    assert collected.wait(WAIT), "stale reference not collected"


@pytest.mark.parametrize("number", [0, -1])
def test_max_workers_negative(number):
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        Scheduler(max_workers=number)


def test_free_reference(executor):
    # The result iterator holds no reference to the results it gave out.
    for obj in executor.map(cj.make_dummy_object, range(10)):
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None


# ----------------------------------------- max_workers, as ProcessPoolExecutor names it


def test_max_workers_is_an_alias_of_workers(make_scheduler):
    s = make_scheduler(max_workers=2)
    assert s.workers == 2 and len(s.stats().workers) == 2
    with pytest.raises(ConfigError, match="not both"):
        Scheduler(workers=2, max_workers=2)
    with pytest.raises(ConfigError, match=r"^workers must be greater than 0"):
        Scheduler(workers=0)
    with pytest.raises(ConfigError, match=r"^max_workers must be an int"):
        Scheduler(max_workers=2.5)  # type: ignore[arg-type]


# ------------------------------------------ generic parts of test_process_pool.py


def test_map_chunksize(executor):
    expected = list(map(pow, range(40), range(40)))
    for chunksize in (6, 50, 40):
        assert list(executor.map(pow, range(40), range(40), chunksize=chunksize)) == expected
    for bad in (-1, 0):
        with pytest.raises(ValueError, match="chunksize"):
            list(executor.map(pow, range(40), range(40), chunksize=bad))


def test_traceback(executor):
    # The worker's traceback reaches the caller as the exception's __cause__.
    future = executor.submit(cj.raise_runtime_error)
    with pytest.raises(Exception) as caught:
        future.result(WAIT)
    exc = caught.value
    assert type(exc) is RuntimeError and exc.args == (123,)
    cause = exc.__cause__
    assert type(cause) is RemoteTraceback  # the stdlib's is process._RemoteTraceback
    assert "raise RuntimeError(123)  # some comment" in cause.tb
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            raise exc
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
    assert "raise RuntimeError(123)  # some comment" in stderr.getvalue()


def test_a_killed_worker_fails_only_its_job(executor, fifo):
    # Differs (test_killed_child): the stdlib breaks the whole pool, and submit raises
    # BrokenProcessPool after it. Here the job's own future fails, its worker is
    # replaced, and the scheduler takes jobs as before.
    future = executor.submit(jobs.announce_then_sleep, fifo, WAIT)
    [pid] = wait_started(fifo)
    # Differs: running() stays False while the job runs (documented): the manager
    # reports outcomes, not starts.
    assert not future.running() and not future.done()
    os.kill(pid, 9)
    with pytest.raises(WorkerCrashedError) as caught:
        future.result(WAIT)
    assert caught.value.exitcode == -9
    assert executor.submit(pow, 2, 8).result(WAIT) == 256


def test_traceback_when_child_process_terminates_abruptly(executor):
    # Differs: WorkerCrashedError (a ChildProcessError) names the exit code, where the
    # stdlib raises BrokenProcessPool with the code in a chained traceback.
    future = executor.submit(os._exit, 99)
    with pytest.raises(WorkerCrashedError, match="exited with code 99") as caught:
        future.result(WAIT)
    assert caught.value.exitcode == 99


def test_ressources_gced_in_workers(executor, listener):
    # The worker drops a job's arguments once the job is done. The object says which
    # process dropped it; ours keeps its copy until the test ends.
    obj = cj.DelSignal(listener.path)
    executor.submit(id, obj).result(WAIT)
    assert int(listener.line()) != os.getpid()
    del obj


def test_ressources_gced_in_workers_with_a_manager_event(executor):
    # CPython's own version: the object sets an Event of a multiprocessing.Manager when the
    # worker drops it, which needs the workers to share this process's authkey.
    mgr = multiprocessing.Manager()
    try:
        obj = cj.EventfulGCObj(mgr)
        executor.submit(id, obj).result(WAIT)
        assert obj.event.wait(timeout=WAIT)
        # Dropped while the manager still runs, so that our copy's __del__ can reach it.
        gc.collect()
        del obj
        gc.collect()
    finally:
        mgr.shutdown()
        mgr.join()


def test_max_tasks_per_worker(make_scheduler):
    with pytest.raises(ValueError):  # the stdlib refuses fork with max_tasks_per_child
        Scheduler(workers=1, mp_context="fork", max_tasks_per_worker=3)
    s = make_scheduler(workers=1, max_tasks_per_worker=3)
    original = s.submit(os.getpid).result(WAIT)
    assert s.submit(os.getpid).result(WAIT) == original
    assert s.submit(os.getpid).result(WAIT) == original
    # The fourth job runs in a new worker: the first left after three.
    assert s.submit(os.getpid).result(WAIT) != original
    assert len(s.stats().workers) == 1


@pytest.mark.parametrize(("workers", "max_tasks", "count"), [(1, 2, 6), (2, 2, 8)])
def test_max_tasks_per_worker_with_a_backlog_gh115634(make_scheduler, workers, max_tasks, count):
    s = make_scheduler(workers=workers, max_tasks_per_worker=max_tasks)
    submitted = [s.submit(cj.mul, i, 2) for i in range(count)]
    assert [f.result(WAIT) for f in submitted] == [i * 2 for i in range(count)]


def test_shutdown_no_wait_max_tasks_gh119592(make_scheduler, listener, gate):
    # A worker leaving at its task limit after shutdown(wait=False) is still replaced,
    # so the jobs queued behind it run. (The original's variants that drop the executor
    # are in test_del_shutdown: a dropped Scheduler stops instead.)
    s = make_scheduler(workers=1, max_tasks_per_worker=1)
    submitted = [s.submit(cj.report_wait_return, listener.path, gate, i) for i in range(3)]
    assert listener.line() == "0"  # the first job runs; the worker leaves after it
    s.shutdown(wait=False)
    cj.open_gate(gate)
    assert [f.result(WAIT) for f in submitted] == [0, 1, 2]


def test_max_tasks_early_shutdown(make_scheduler):
    s = make_scheduler(workers=2, max_tasks_per_worker=1)
    submitted = [s.submit(cj.mul, i, i) for i in range(6)]
    s.shutdown()
    assert [f.result(0) for f in submitted] == [i * i for i in range(6)]


# ---------------------------------------------------------- test_as_completed.py


def test_as_completed_no_timeout(executor):
    future1 = executor.submit(cj.mul, 2, 21)
    future2 = executor.submit(cj.mul, 7, 6)
    given = {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future1, future2}
    assert set(futures.as_completed(given, timeout=WAIT)) == given


@pytest.mark.parametrize("timeout", [0, 0.1])
def test_as_completed_future_times_out(executor, gate, timeout):
    already_completed = {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE}
    future = executor.submit(cj.wait_gate, gate)
    completed = set()
    with pytest.raises(futures.TimeoutError):
        for f in futures.as_completed(already_completed | {future}, timeout):
            completed.add(f)
    assert completed == already_completed


def test_as_completed_duplicate_futures(executor):
    future = executor.submit(time.sleep, 0.2)
    assert len(list(futures.as_completed([future] * 3, timeout=WAIT))) == 1


def test_as_completed_timeout_message_counts_our_cancelled_futures(executor):
    # With our futures instead of premade ones: a job cancelled in the heap counts as
    # finished, a job not yet due does not.
    cancelled = executor.schedule(cj.mul, 1, 1, delay=3600)
    executor.stats()  # in the heap now, not in the outbox
    assert cancelled.cancel()
    pending = executor.schedule(cj.mul, 1, 1, delay=3600)
    finished = executor.submit(cj.mul, 1, 1)
    finished.result(WAIT)
    try:
        with pytest.raises(futures.TimeoutError) as caught:
            list(futures.as_completed([cancelled, pending, RUNNING_FUTURE, finished], timeout=0))
        assert str(caught.value) == "2 (of 4) futures unfinished"
    finally:
        pending.cancel()


# -------------------------------------------------------------------- test_wait.py


def test_wait_20369(executor):
    future = executor.submit(cj.mul, 1, 2)
    done, not_done = futures.wait([future, future], timeout=WAIT, return_when=futures.ALL_COMPLETED)
    assert done == {future} and not_done == set()


def test_wait_first_completed(executor, gate):
    future1 = executor.submit(cj.mul, 21, 2)
    future2 = executor.submit(cj.wait_gate, gate)
    try:
        done, not_done = futures.wait(
            [CANCELLED_FUTURE, future1, future2], timeout=WAIT, return_when=futures.FIRST_COMPLETED
        )
        assert done == {future1}
        assert not_done == {CANCELLED_FUTURE, future2}
    finally:
        cj.open_gate(gate)
    assert future2.result(WAIT)


def test_wait_first_completed_some_already_completed(executor, gate):
    future1 = executor.submit(cj.wait_gate, gate)
    try:
        finished, pending = futures.wait(
            [CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE, future1],
            timeout=WAIT,
            return_when=futures.FIRST_COMPLETED,
        )
        assert finished == {CANCELLED_AND_NOTIFIED_FUTURE, SUCCESSFUL_FUTURE}
        assert pending == {future1}
    finally:
        cj.open_gate(gate)
    assert future1.result(WAIT)


def test_wait_first_exception(executor, tmp_path):
    gate1, gate2 = str(tmp_path / "gate1"), str(tmp_path / "gate2")
    os.mkfifo(gate1)
    os.mkfifo(gate2)
    try:
        future1 = executor.submit(cj.mul, 2, 21)
        future2 = executor.submit(cj.wait_gate_and_raise, gate1)
        future3 = executor.submit(cj.wait_gate, gate2)

        def open_after_future1() -> None:  # future1 must finish before future2 fails
            future1.result(WAIT)
            cj.open_gate(gate1)

        opener = threading.Thread(target=open_after_future1)
        opener.start()
        finished, pending = futures.wait(
            [future1, future2, future3], timeout=WAIT, return_when=futures.FIRST_EXCEPTION
        )
        assert finished == {future1, future2}
        assert pending == {future3}
        opener.join(WAIT)
    finally:
        cj.open_gate(gate1)
        cj.open_gate(gate2)
    assert future3.result(WAIT)


def test_wait_first_exception_some_already_complete(executor, gate):
    future1 = executor.submit(divmod, 21, 0)
    future2 = executor.submit(cj.wait_gate, gate)
    try:
        finished, pending = futures.wait(
            [SUCCESSFUL_FUTURE, CANCELLED_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, future1, future2],
            timeout=WAIT,
            return_when=futures.FIRST_EXCEPTION,
        )
        assert finished == {SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, future1}
        assert pending == {CANCELLED_FUTURE, future2}
    finally:
        cj.open_gate(gate)
    assert future2.result(WAIT)


def test_wait_first_exception_one_already_failed(executor, gate):
    future1 = executor.submit(cj.wait_gate, gate)
    try:
        finished, pending = futures.wait(
            [EXCEPTION_FUTURE, future1], timeout=WAIT, return_when=futures.FIRST_EXCEPTION
        )
        assert finished == {EXCEPTION_FUTURE}
        assert pending == {future1}
    finally:
        cj.open_gate(gate)
    assert future1.result(WAIT)


def test_wait_all_completed(executor):
    future1 = executor.submit(divmod, 2, 0)
    future2 = executor.submit(cj.mul, 2, 21)
    given = {SUCCESSFUL_FUTURE, CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, future1, future2}
    finished, pending = futures.wait(given, timeout=WAIT, return_when=futures.ALL_COMPLETED)
    assert finished == given and pending == set()


def test_wait_timeout(executor, gate):
    future = executor.submit(cj.wait_gate, gate)
    try:
        finished, pending = futures.wait(
            [CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE, future],
            timeout=0.05,
            return_when=futures.ALL_COMPLETED,
        )
        assert finished == {CANCELLED_AND_NOTIFIED_FUTURE, EXCEPTION_FUTURE, SUCCESSFUL_FUTURE}
        assert pending == {future}
    finally:
        cj.open_gate(gate)
    assert future.result(WAIT)


# ---------------------------------------------------------------- test_shutdown.py


def test_run_after_shutdown(make_scheduler):
    s = make_scheduler(workers=1)
    s.shutdown()
    with pytest.raises(RuntimeError, match=r"^cannot schedule new futures after shutdown"):
        s.submit(pow, 2, 5)
    with pytest.raises(SchedulerShutdownError, match=r"^cannot schedule new futures after"):
        s.map(pow, [2], [5])


INTERPRETER_EXIT = """
import os, select, sys
from mpsched import Scheduler
from contract_jobs import report_sleep_print
if __name__ == "__main__":
    said = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
    t = Scheduler(5)
    t.submit(report_sleep_print, sys.argv[1], 1.0, "apple")
    assert select.select([said], [], [], 60)[0], "the job did not start"
"""


def test_interpreter_shutdown(tmp_path):
    # As in the stdlib, the job submitted before exit runs to completion first (due jobs
    # not yet started would too; jobs due later are dropped, see tests/test_exit.py).
    fifo = str(tmp_path / "said.fifo")
    os.mkfifo(fifo)
    done = run_script(INTERPRETER_EXIT, fifo)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == "apple"


SUBMIT_AT_EXIT = """
import atexit
@atexit.register
def run_last():
    try:
        t.submit(id, None)
    except RuntimeError:
        print("runtime-error")
        raise
from mpsched import Scheduler
if __name__ == "__main__":
    t = Scheduler(2)
    t.submit(id, 42).result()
"""


def test_submit_after_interpreter_shutdown():
    done = run_script(SUBMIT_AT_EXIT)
    # Our RuntimeError is a SchedulerShutdownError, with the stdlib's words.
    # The words the stdlib uses for a shut-down executor (our client is closed at exit).
    assert (
        "SchedulerShutdownError: cannot schedule new futures after shutdown (the "
        "interpreter is exiting)"
    ) in done.stderr
    assert done.stdout.strip() == "runtime-error"


def test_hang_issue12364(make_scheduler):
    s = make_scheduler(workers=2)
    submitted = [s.submit(time.sleep, 0.01) for _ in range(50)]
    s.shutdown()
    for future in submitted:
        assert future.result(0) is None


def test_cancel_futures(make_scheduler, listener):
    s = make_scheduler(workers=2)
    submitted = [s.submit(cj.report_then_sleep, listener.path, i, 0.1) for i in range(50)]
    # Differs in timing only: our cancel takes back every job no worker has taken, so
    # whether any job ran before shutdown() would be luck. Wait until one started.
    listener.line()
    s.shutdown(cancel_futures=True)
    cancelled = [f for f in submitted if f.cancelled()]
    assert len(cancelled) > 20
    others = [f for f in submitted if not f.cancelled()]
    assert others
    for future in others:
        assert future.done()
        assert future.exception(0) is None


SHUTDOWN_NO_WAIT = """
from mpsched import Scheduler
from contract_jobs import sleep_and_print
if __name__ == "__main__":
    t = Scheduler(max_workers=3)
    t.submit(sleep_and_print, 1.0, "apple")
    t.shutdown(wait=False)
"""


def test_hang_gh83386():
    # shutdown(wait=False) with a job queued: the program still exits once it ran.
    # (The stdlib skips this for ProcessPoolExecutor: it hangs there.)
    done = run_script(SHUTDOWN_NO_WAIT)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == "apple"


def test_hang_gh94440(make_scheduler):
    # shutdown(wait=True) returns when a job was submitted and cancelled right before.
    s = make_scheduler(workers=1)
    s.submit(int).result(WAIT)
    s.submit(int).cancel()
    t0 = time.monotonic()
    s.shutdown(wait=True)
    assert time.monotonic() - t0 < 15


def test_processes_terminate(make_scheduler, gate):
    s = make_scheduler(workers=3)
    blocked = [s.submit(cj.wait_gate, gate) for _ in range(3)]
    pids = process_ids(s)
    assert len(pids) == 1 + 3
    cj.open_gate(gate)
    s.shutdown()
    assert all(f.result(0) for f in blocked)
    assert_gone(pids)


def test_context_manager_shutdown():
    with Scheduler(max_workers=2) as e:
        pids = process_ids(e)
        assert list(e.map(abs, range(-5, 5))) == [5, 4, 3, 2, 1, 0, 1, 2, 3, 4]
    assert_gone(pids)


def test_del_shutdown():
    # Differs: dropping a Scheduler stops its manager (documented), so jobs not yet
    # started fail with SchedulerShutdownError instead of running; none is left
    # hanging and no process is left behind. (The stdlib computes every result.) This
    # also stands for test_process_pool's gh119592/gh152967 variants that drop the
    # executor. Futures here instead of map(): its iterator stops at the first error.
    executor = Scheduler(max_workers=2)
    pids = process_ids(executor)
    submitted = [executor.submit(abs, v) for v in range(-5, 5)]
    del executor
    gc.collect()
    assert_gone(pids)
    for future, value in zip(submitted, range(-5, 5), strict=True):
        error = future.exception(WAIT)
        if error is None:
            assert future.result() == abs(value)
        else:
            assert isinstance(error, SchedulerShutdownError)


def test_shutdown_no_wait(make_scheduler):
    s = make_scheduler(max_workers=2)
    res = s.map(abs, range(-5, 5))
    pids = process_ids(s)
    s.shutdown(wait=False)
    assert s._closing.closer is not None
    s._closing.closer.join(WAIT)
    assert_gone(pids)
    # Every result was computed before the scheduler stopped.
    assert list(res) == [abs(v) for v in range(-5, 5)]


@pytest.mark.parametrize("workers", [2, 4])
def test_shutdown_after_a_failed_task_with_max_tasks_gh132969(make_scheduler, workers):
    s = make_scheduler(workers=workers, max_tasks_per_worker=1)
    f1 = s.submit(cj.good_task, 1)
    f2 = s.submit(cj.failing_task, 2)
    f3 = s.submit(cj.good_task, 3)
    result = 0
    with pytest.raises(ValueError, match="failing task"):
        result += f1.result(WAIT)
        result += f2.result(WAIT)
        result += f3.result(WAIT)
    assert result == 1
    pids = process_ids(s)
    s.shutdown(wait=False)
    assert s._closing.closer is not None
    s._closing.closer.join(WAIT)
    assert not s._closing.closer.is_alive()
    assert_gone(pids)
