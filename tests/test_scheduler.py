"""End to end: a Scheduler with real manager and worker processes."""

from __future__ import annotations

import base64
import itertools
import math
import multiprocessing
import os
import sys
import threading
import time
import urllib.request
from concurrent.futures import CancelledError
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jobs
import psutil
import pytest
from processes import wait_for, wait_started

from mpsched import (
    ConfigError,
    InvalidJobError,
    JobPicklingError,
    Priority,
    QueueFullError,
    RemoteTraceback,
    SchedulerShutdownError,
)

pytestmark = pytest.mark.slow

START_METHODS = [pytest.param("forkserver", id="forkserver"), pytest.param("spawn", id="spawn")]


@pytest.mark.parametrize("method", START_METHODS)
def test_jobs_start_at_their_due_time_not_before(make_scheduler, method):
    s = make_scheduler(workers=2, mp_context=method)
    delays = [0.2, 0.4, 0.6, 0.8]
    submitted = [(time.monotonic() + d, s.schedule(jobs.stamp, d, delay=d)) for d in delays]
    for earliest, future in submitted:
        _, _, started = future.result(timeout=30)
        assert started >= earliest
        assert started - earliest < 1.0  # generous: lateness numbers live in benchmarks/


def test_jobs_handed_out_early_still_start_at_their_due_time(make_scheduler):
    # Local workers get a job EARLY_HANDOFF before it is due and sleep the rest; the
    # manager compares each start with the exact due time it computed.
    s = make_scheduler(workers=2)
    at = time.time() + 0.3
    futures = [s.schedule(jobs.stamp, i, at=at + i * 0.003) for i in range(100)]
    for future in futures:
        future.result(timeout=30)
    stats = s.stats().queue
    assert stats.completed == 100 and stats.started_early == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux timer setting")
def test_workers_sleep_with_a_1_ns_timer_slack(make_scheduler):
    # The default 50 µs slack would add to the lateness of every job handed out early.
    s = make_scheduler(workers=1)
    assert s.submit(jobs.timer_slack).result(timeout=30) == 1


def test_one_worker_runs_jobs_in_exact_heap_order(make_scheduler):
    s = make_scheduler(workers=1)
    at1 = time.time() + 1.0
    at2 = at1 + 0.2
    plan = [  # (tag, at, priority) in scrambled submission order
        ("b-low-1", at2, Priority.LOW),
        ("a-med-1", at1, Priority.MEDIUM),
        ("b-high-1", at2, Priority.HIGH),
        ("a-low-1", at1, Priority.LOW),
        ("a-high-1", at1, Priority.HIGH),
        ("a-med-2", at1, Priority.MEDIUM),
        ("b-low-2", at2, Priority.LOW),
        ("a-high-2", at1, Priority.HIGH),
    ]
    futures = [s.schedule(jobs.stamp, tag, at=at, priority=p) for tag, at, p in plan]
    ran = sorted((f.result(timeout=30) for f in futures), key=lambda r: r[2])
    expected = [
        "a-high-1",
        "a-high-2",
        "a-med-1",
        "a-med-2",
        "a-low-1",
        "b-high-1",
        "b-low-1",
        "b-low-2",
    ]
    assert [tag for tag, _, _ in ran] == expected


def test_cpu_bound_jobs_run_in_parallel_on_distinct_processes(make_scheduler):
    s = make_scheduler(workers=2)
    t0 = time.monotonic()
    results = [f.result(timeout=60) for f in [s.submit(jobs.burn, 0.5) for _ in range(4)]]
    elapsed = time.monotonic() - t0
    assert len({pid for pid, *_ in results}) == 2
    intervals = sorted((start, end) for _, start, end, _ in results)
    assert any(b_start < a_end for (_, a_end), (b_start, _) in itertools.pairwise(intervals))
    # Serial would take the sum of the job durations; two workers take about half of it.
    # The job durations stretch under load, so the ratio, not 2 s, is what is checked.
    serial = sum(end - start for _, start, end, _ in results)
    assert elapsed < 0.8 * serial


def test_lambdas_and_closures_run(make_scheduler):
    s = make_scheduler(workers=1)
    base = 40

    def add(x: int) -> int:
        return base + x

    assert s.submit(lambda: 1 + 1).result(timeout=30) == 2
    assert s.submit(add, 2).result(timeout=30) == 42
    assert list(s.map(lambda x: x * x, range(5), timeout=30)) == [0, 1, 4, 9, 16]


def test_exception_reaches_future_with_remote_traceback(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.submit(jobs.fail, "boom")
    exc = future.exception(timeout=30)
    assert isinstance(exc, ValueError) and str(exc) == "boom"
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "in fail" in str(exc.__cause__) and "ValueError: boom" in str(exc.__cause__)
    with pytest.raises(ValueError, match="boom"):
        future.result()
    assert s.submit(jobs.stamp, "after").result(timeout=30)[0] == "after"  # worker survived


def test_the_traceback_of_code_sent_by_value_names_its_file_and_line(make_scheduler):
    s = make_scheduler(workers=1)

    def local_failure(x):  # a local function travels by value, as __main__'s do
        raise ValueError(f"by value {x}")

    line = local_failure.__code__.co_firstlineno + 1
    where = f'File "{__file__}", line {line}, in local_failure'
    with pytest.raises(ValueError, match="by value 2") as mapped:
        list(s.map(local_failure, [2], timeout=30))  # map() pickles the callable apart
    for exc in (s.submit(local_failure, 1).exception(timeout=30), mapped.value):
        assert isinstance(exc, ValueError) and isinstance(exc.__cause__, RemoteTraceback)
        assert where in str(exc.__cause__), exc.__cause__
        assert 'raise ValueError(f"by value {x}")' in str(exc.__cause__)  # its source


FAILING_MAIN_SCRIPT = """\
from mpsched import Scheduler


def boom():
    raise ValueError("boom")


if __name__ == "__main__":
    with Scheduler(workers=1) as s:
        print(s.submit(boom).exception(timeout=60).__cause__)
"""


def test_the_traceback_of_a_function_of_the_main_script_names_the_script(procs, tmp_path):
    script = tmp_path / "failing_script.py"
    script.write_text(FAILING_MAIN_SCRIPT)
    ran = procs.run(
        "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", str(script)
    )
    assert ran.returncode == 0, ran.stderr
    assert f'File "{script}", line 5, in boom\n    raise ValueError("boom")' in ran.stdout, (
        ran.stdout
    )
    assert "<dynamic-code>" not in ran.stdout


def test_cancel_removes_pending_job_from_heap(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.stamp, "never", delay=3600)
    assert s.stats().pending["medium"] == 1
    assert future.cancel()
    assert future.cancelled()
    with pytest.raises(CancelledError):
        future.result(timeout=1)
    stats = s.stats()
    assert stats.pending["medium"] == 0 and stats.queue.cancelled == 1
    done = s.submit(jobs.stamp, "done")
    done.result(timeout=30)
    assert not done.cancel()


def test_shutdown_waits_for_pending_jobs(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.stamp, "late", delay=0.5)
    s.shutdown(wait=True)
    assert future.done() and future.result()[0] == "late"
    with pytest.raises(SchedulerShutdownError):
        s.submit(jobs.stamp)
    assert not s._manager_process.is_alive()


def test_shutdown_cancel_futures_cancels_pending_and_returns_promptly(make_scheduler):
    s = make_scheduler(workers=1)
    far = [s.schedule(jobs.stamp, i, delay=3600) for i in range(5)]
    t0 = time.monotonic()
    s.shutdown(wait=True, cancel_futures=True)
    assert time.monotonic() - t0 < 15
    assert all(f.cancelled() for f in far)
    assert not s._manager_process.is_alive()


def test_shutdown_without_wait_returns_at_once_and_finishes_later(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.stamp, "bg", delay=0.5)
    t0 = time.monotonic()
    s.shutdown(wait=False)
    assert time.monotonic() - t0 < 0.5
    assert future.result(timeout=30)[0] == "bg"
    s._closing.closer.join(30)
    assert not s._manager_process.is_alive()


def test_idle_workers_and_manager_use_almost_no_cpu(make_scheduler):
    s = make_scheduler(workers=2)
    s.schedule(jobs.stamp, delay=3600)
    procs = [psutil.Process(s._manager_process.pid)]
    procs += [psutil.Process(w.pid) for w in s.stats().workers]
    assert len(procs) == 3

    def cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    before = cpu()
    # A measurement window, not synchronisation: idle cost is CPU used over time.
    threading.Event().wait(2.0)
    assert cpu() - before < 0.05


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"delay": math.nan}, "finite", id="nan-delay"),
        pytest.param({"delay": math.inf}, "finite", id="inf-delay"),
        pytest.param({"delay": 10**400}, "overflows", id="overflowing-delay"),
        pytest.param({"at": -math.inf}, "finite", id="inf-at"),
        pytest.param({"delay": 1, "at": time.time()}, "not both", id="both"),
        pytest.param({"delay": "soon"}, "number", id="string-delay"),
        pytest.param({"priority": "urgent"}, "unknown priority", id="unknown-priority"),
        pytest.param({"priority": 1}, "unknown priority", id="int-priority"),
    ],
)
def test_bad_schedule_arguments_raise_at_call_site_and_queue_nothing(
    make_scheduler, options, message
):
    s = make_scheduler(workers=1)
    with pytest.raises(InvalidJobError, match=message):
        s.schedule(jobs.stamp, **options)
    assert s.stats().queue.submitted == 0


def test_unpicklable_arguments_raise_at_call_site_and_queue_nothing(make_scheduler):
    s = make_scheduler(workers=1)
    with pytest.raises(JobPicklingError, match="stamp"):
        s.submit(jobs.stamp, threading.Lock())
    with pytest.raises(InvalidJobError, match="not callable"):
        s.submit(42)
    assert s.stats().queue.submitted == 0
    assert s.submit(jobs.stamp, "ok").result(timeout=30)[0] == "ok"


def test_times_as_datetime_timedelta_epoch_and_past(make_scheduler):
    s = make_scheduler(workers=2)
    now = time.time()
    t0 = time.monotonic()
    futures = {
        "aware": s.schedule(
            jobs.stamp, delay=None, at=datetime.fromtimestamp(now + 0.4, tz=timezone.utc)
        ),
        "naive": s.schedule(jobs.stamp, at=datetime.fromtimestamp(now + 0.4)),
        "epoch": s.schedule(jobs.stamp, at=now + 0.4),
        "timedelta": s.schedule(jobs.stamp, delay=timedelta(milliseconds=400)),
        "past": s.schedule(jobs.stamp, at=now - 3600),
        "negative": s.schedule(jobs.stamp, delay=-5),
    }
    started = {name: f.result(timeout=30)[2] - t0 for name, f in futures.items()}
    for name in ("aware", "naive", "epoch", "timedelta"):
        assert 0.39 <= started[name] < 2.0, (name, started)
    assert started["past"] < 0.39 and started["negative"] < 0.39


def test_bounded_queue_times_out_with_queue_full_and_queues_nothing(make_scheduler):
    s = make_scheduler(workers=1, max_pending=2, submit_timeout=0.5)
    held = [s.schedule(jobs.stamp, i, delay=3600) for i in range(2)]
    t0 = time.monotonic()
    with pytest.raises(QueueFullError):
        s.schedule(jobs.stamp, "third", delay=3600)
    assert time.monotonic() - t0 >= 0.5
    assert s.stats().queue.submitted == 2
    assert held[0].cancel()  # room again: the next submit goes in
    s.schedule(jobs.stamp, "third", delay=3600)
    assert sum(s.stats().pending.values()) == 2


def test_priority_order_lets_urgent_job_overtake_overdue_backlog(make_scheduler):
    s = make_scheduler(workers=1, order="priority")
    gate = s.submit(jobs.burn, 0.3)  # keeps the one worker busy while the backlog builds
    at = time.time() + 0.1
    low = [s.schedule(jobs.stamp, f"low{i}", at=at, priority="low") for i in range(3)]
    high = s.schedule(jobs.stamp, "high", at=at + 0.05, priority="high")
    gate.result(timeout=30)
    order = sorted((f.result(timeout=30) for f in [*low, high]), key=lambda r: r[2])
    assert order[0][0] == "high"


def test_stats_report_counts_workers_and_lateness(make_scheduler):
    s = make_scheduler(workers=2)
    for f in [s.submit(jobs.stamp, i) for i in range(10)]:
        f.result(timeout=30)
    s.submit(jobs.fail, "x").exception(timeout=30)
    stats = s.stats()
    assert stats.completed == 10 and stats.failed == 1 and stats.in_flight == 0
    assert stats.queue.lateness_samples == 11
    assert set(stats.lateness) == {"p50", "p90", "p99", "max"}
    assert 0 <= stats.lateness["p50"] <= stats.lateness["max"] < 5
    assert len(stats.workers) == 2 and sum(w.jobs_done for w in stats.workers) == 11


def test_bad_scheduler_options_raise():
    from mpsched import Scheduler

    with pytest.raises(ConfigError):
        Scheduler(workers=0)
    with pytest.raises(ConfigError):
        Scheduler(workers=1, mp_context="fork")
    with pytest.raises(ConfigError):
        Scheduler(workers=1, order="random")


@pytest.mark.parametrize(
    "name", ["max_tasks_per_worker", "max_memory_per_worker", "max_pending", "max_pending_bytes"]
)
@pytest.mark.parametrize("value", [0, -1, 2.5, "10", True])
def test_a_bound_that_is_not_a_positive_int_is_refused_before_anything_starts(
    name: str, value: object
) -> None:
    from mpsched import Scheduler

    with pytest.raises(ConfigError, match=f"^{name} must be a positive int"):
        Scheduler(workers=1, **{name: value})  # type: ignore[arg-type]


def test_a_schedulers_status_page_is_loopback_only(tmp_path):
    from mpsched import AddressError, Scheduler

    with pytest.raises(ConfigError, match="a Scheduler has no TLS"):
        Scheduler(workers=1, http="0.0.0.0:0")
    with pytest.raises(AddressError, match="bad HTTP address 'unix:/tmp/page'"):
        Scheduler(workers=1, http="unix:/tmp/page")
    with pytest.raises(ConfigError, match="http_token_file must be left out without http"):
        Scheduler(workers=1, http_token_file=tmp_path / "token")


def test_a_port_alone_serves_the_status_page_on_loopback(make_scheduler):
    s = make_scheduler(workers=1, http=0)
    assert s.http_url is not None and s.http_url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(s.http_url + "metrics", timeout=10) as answer:
        assert answer.status == 200


def test_workers_not_ready_in_start_timeout_raise_instead_of_hanging():
    from mpsched import MpschedError, Scheduler

    with pytest.raises(MpschedError, match="did not start within"):
        Scheduler(workers=1, mp_context="spawn", start_timeout=0.001)


def test_map_batches_keep_input_order_and_heap_order(make_scheduler):
    s = make_scheduler(workers=1)
    items = list(range(600))  # more than one batch of 256
    results = list(s.map(jobs.stamp, items, timeout=60))
    assert [tag for tag, _, _ in results] == items
    starts = [started for _, _, started in results]
    assert starts == sorted(starts)  # one worker: submission order is run order


def test_map_with_an_unpicklable_item_queues_nothing(make_scheduler):
    s = make_scheduler(workers=1)
    with pytest.raises(JobPicklingError):
        s.map(jobs.stamp, [1, 2, threading.Lock()])
    assert s.stats().queue.submitted == 0


def test_map_cancels_unstarted_jobs_when_closed_early(make_scheduler):
    s = make_scheduler(workers=1)
    gate = s.submit(jobs.burn, 0.5)  # the one worker is busy: the map's jobs wait
    results = s.map(jobs.stamp, range(50))
    results.close()
    gate.result(timeout=30)
    stats = s.stats().queue
    # Each job was either withdrawn before it was sent or cancelled in the heap.
    assert stats.completed == 1 and stats.submitted - 1 == stats.cancelled
    assert sum(stats.pending.values()) == 0 and stats.in_flight == 0


def test_map_timeout_raises_and_cancels_the_rest(make_scheduler):
    from concurrent.futures import TimeoutError as FuturesTimeout

    s = make_scheduler(workers=1)
    results = s.map(jobs.burn, [0.5] + [0.01] * 20, timeout=0.1)
    with pytest.raises(FuturesTimeout):
        list(results)
    stats = s.stats().queue
    assert stats.submitted - stats.cancelled <= 2  # the running job, and one taken at most
    assert sum(stats.pending.values()) == 0


def test_map_on_a_bounded_queue_batches_below_max_pending(make_scheduler):
    s = make_scheduler(workers=1, max_pending=4)
    assert sorted(r[0] for r in s.map(jobs.stamp, range(10), timeout=60)) == list(range(10))


MAIN_SCRIPT = """
import sys
from mpsched import Scheduler

class Point:
    def __init__(self, x):
        self.x = x

def norm(p):
    return abs(p.x)

if __name__ == "__main__":
    with Scheduler(workers=1) as s:
        print(s.submit(norm, Point(-3)).result(timeout=30),
              list(s.map(norm, [Point(-1), Point(2)], timeout=30)), flush=True)
"""


def test_functions_and_classes_from_the_main_script_run_in_workers(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3 [1, 2]"


def test_fast_pickling_is_used_only_where_it_matches_cloudpickle():
    import types

    from mpsched._payload.pickling import fast_dumps

    assert fast_dumps((jobs.stamp, (1, "x"), {})) is not None  # importable: by reference
    assert fast_dumps((lambda: 1, (), {})) is None  # needs cloudpickle
    main_class = types.new_class("Local")
    main_class.__module__ = "__main__"
    assert fast_dumps((jobs.stamp, (main_class,), {})) is None  # the worker has no such main


def test_any_end_of_the_result_thread_fails_every_outstanding_future(make_scheduler):
    s = make_scheduler(workers=1)
    later = s.schedule(jobs.noop, 1, delay=600)

    def broken(client_id, timeout, waiting=0):
        raise RuntimeError("a bug in the result thread")

    s._core.service.collect = broken  # the result thread's next call fails
    s.submit(jobs.noop, 2)  # ends the collect under way (or its long poll does)
    error = later.exception(timeout=30)
    assert isinstance(error, SchedulerShutdownError)
    assert "result thread failed" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    with pytest.raises(SchedulerShutdownError):
        s.submit(jobs.noop, 3)
    s.shutdown(wait=True)  # nothing outstanding is left to wait for


DYING_CLIENT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import jobs, mpsched
client = mpsched.connect({address!r}, authkey=bytes.fromhex({key!r}))
futures = [client.schedule(jobs.noop, bytes(200_000), delay=0.5) for _ in range(4)]
client.stats()  # every job has reached the manager
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_client_that_dies_leaves_nothing_in_the_manager(make_scheduler, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    s = make_scheduler(workers=1)
    assert s.stats().clients == 1
    script = DYING_CLIENT.format(
        tests=str(Path(__file__).parent), address=s.address, key=s.authkey.hex()
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == -9
    # Its jobs still run; their outcomes have nobody to go to and are not kept.
    wait_for(lambda: s.stats().completed == 4, 60, "the dead client's jobs ran")
    wait_for(lambda: s.stats().clients == 1, 30, "the dead client's mailbox dropped")


def test_stats_count_a_job_cancelled_right_after_its_submit(make_scheduler):
    s = make_scheduler(workers=1)
    futures = [s.schedule(jobs.noop, n, delay=60) for n in range(20)]
    assert futures[-1].cancel()  # most likely still in the outbox: never sent
    q = s.stats().queue
    assert (q.submitted, q.cancelled, sum(q.pending.values())) == (20, 1, 19)


def test_dropping_a_map_iterator_cancels_its_jobs_in_one_call(make_scheduler, fifo):
    import gc

    s = make_scheduler(workers=1)
    blocker = s.submit(jobs.announce_then_sleep, fifo, 60)
    wait_started(fifo)  # the only worker is busy: every map job stays pending
    results = s.map(jobs.noop, range(50))
    s.stats()  # they have all reached the manager
    calls = []
    service = s._core.service

    def counting(name):
        real = getattr(service, name)

        def counted(*args):
            calls.append(name)
            return real(*args)

        return counted

    for name in ("cancel", "cancel_many"):
        setattr(service, name, counting(name))
    del results
    gc.collect()
    assert calls == ["cancel_many"]
    assert s.stats().queue.cancelled == 50
    blocker.cancel()


def test_workers_and_jobs_never_inherit_the_authkey_variable(make_scheduler, monkeypatch):
    monkeypatch.setenv("MPSCHED_AUTHKEY", "not-for-jobs")
    s = make_scheduler(workers=1)
    assert s.submit(jobs.getenv, "MPSCHED_AUTHKEY").result(timeout=60) is None


# The default start method, then each one a Scheduler takes.
ANY_START_METHOD = [pytest.param(None, id="default"), *START_METHODS]


@pytest.fixture
def mp_manager():
    """A multiprocessing.Manager of the test process, as a program makes one."""
    manager = multiprocessing.Manager()
    yield manager
    manager.shutdown()


@pytest.mark.parametrize("method", ANY_START_METHOD)
def test_a_job_sets_an_event_of_a_multiprocessing_manager(make_scheduler, mp_manager, method):
    # The workers share this process's multiprocessing authkey, as ProcessPoolExecutor's
    # do: the proxy a job gets connects to the manager that made it.
    event = mp_manager.Event()
    s = make_scheduler(workers=1, mp_context=method)
    assert s.submit(jobs.set_event, event).result(timeout=60) is True
    assert event.is_set()


@pytest.mark.parametrize("method", ANY_START_METHOD)
def test_a_job_puts_into_a_queue_of_a_multiprocessing_manager(make_scheduler, mp_manager, method):
    box = mp_manager.Queue()
    s = make_scheduler(workers=2, mp_context=method)
    pids = [s.submit(jobs.put_in, box, n).result(timeout=60) for n in range(4)]
    assert sorted(box.get(timeout=30) for _ in range(4)) == [0, 1, 2, 3]
    assert os.getpid() not in pids


def test_a_fork_child_that_ends_leaves_its_parents_scheduler_running(make_scheduler):
    # A child that fork made (a Manager's server, where fork is the default) runs
    # threading's exit hooks as it ends: the parent's clients are not its own to close.
    s = make_scheduler(workers=1)
    child = multiprocessing.get_context("fork").Process(target=jobs.noop)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert s.submit(pow, 2, 10).result(timeout=60) == 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_process_authkey_reaches_no_command_line_or_environment(make_scheduler):
    # It travels over the manager's control socket, which only this process holds.
    s = make_scheduler(workers=1)
    s.submit(jobs.noop).result(timeout=60)
    key = bytes(multiprocessing.current_process().authkey)
    shown = (key, key.hex().encode(), base64.b64encode(key))
    for pid in [s._manager_process.pid, *(w.pid for w in s.stats().workers)]:
        for name in ("cmdline", "environ"):
            seen = Path(f"/proc/{pid}/{name}").read_bytes()
            assert not any(form in seen for form in shown), (pid, name)


def test_connect_strips_a_key_as_read_from_a_key_file(make_scheduler):
    import mpsched

    s = make_scheduler(workers=1)
    assert s.authkey == s.authkey.strip()  # printable: safe to strip
    client = mpsched.connect(s.address, authkey=s.authkey + b"\n")
    client.detach()
