"""Named queues and limits end to end: pools that serve some queues only, limits that
hold jobs of one kind back without holding up the others, with and without a store."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import pytest
import retry_jobs
from served import Manager, Processes, serve

from mpsched import RetryPolicy, Scheduler
from mpsched._errors import InvalidJobError

RESULT = 60.0  # seconds a test waits for a result, on a loaded 2-core machine


def start_pool(procs: Processes, manager: Manager, queues: str, processes: int = 1) -> Any:
    pool = procs.start(
        "worker",
        *manager.cli(),
        "--processes",
        str(processes),
        "--heartbeat-interval",
        "0.5",
        "--queues",
        queues,
    )
    assert "joined" in pool.line()
    return pool


def pool_pids(pool: Any) -> set[int]:
    return {p.pid for p in pool.descendants()}


def spans(log: Path) -> list[tuple[float, float]]:
    return [
        (float(a), float(b)) for a, b in (line.split() for line in log.read_text().splitlines())
    ]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


# ------------------------------------------------------------------------------ queues


def test_gpu_jobs_run_only_on_the_gpu_pool_and_in_strict_order(
    procs: Processes, connect_client: Callable[..., Any]
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1", "--queues", "default")
    gpu = start_pool(procs, manager, "gpu")
    client = connect_client(manager)
    on_gpu = [client.schedule(jobs.stamp, i, queue="gpu") for i in range(6)]
    plain = [client.schedule(jobs.stamp, i) for i in range(6)]
    gpu_ran = {f.result(RESULT)[1] for f in on_gpu}
    plain_ran = {f.result(RESULT)[1] for f in plain}
    gpu_pids = pool_pids(gpu)
    assert gpu_ran <= gpu_pids
    assert not plain_ran & gpu_pids
    gpu.popen.kill()
    both = start_pool(procs, manager, "gpu,default")
    # due at one instant in both queues, default ones submitted first: the
    # gpu,default pool takes gpu first all the same
    at = time.time() + 1.0
    futures = [client.schedule(jobs.stamp, ("default", i), at=at) for i in range(4)]
    futures += [client.schedule(jobs.stamp, ("gpu", i), at=at, queue="gpu") for i in range(4)]
    results = [f.result(RESULT) for f in futures]
    both_pids = pool_pids(both)
    on_both = sorted((start, tag[0]) for tag, pid, start in results if pid in both_pids)
    assert [kind for _, kind in on_both][:4] == ["gpu"] * 4


def test_a_queue_nobody_serves_stays_pending_until_a_pool_joins(
    procs: Processes, connect_client: Callable[..., Any]
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1", "--queues", "default")
    client = connect_client(manager)
    waiting = client.schedule(jobs.stamp, "r", queue="reports")
    assert client.submit(jobs.stamp, "d").result(RESULT)[0] == "d"  # not blocked
    info = client.job_info(waiting.job_id)
    assert (info.state, info.queue) == ("pending", "reports")
    status = procs.run("status", *manager.cli())
    assert "reports" in status.stdout and "no worker serves" in status.stderr, status
    as_json = json.loads(procs.run("status", "--json", *manager.cli()).stdout)
    assert {"name": "reports", "pending": 1, "workers": 0} in as_json["queues"]
    pool = start_pool(procs, manager, "reports")
    ran_on = waiting.result(RESULT)[1]
    assert ran_on in pool_pids(pool)


def test_submit_on_the_command_line_names_a_queue_and_a_limit(procs: Processes) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "1", "--limit", "exports=1")
    done = procs.run(
        "submit",
        "jobs:stamp",
        "--args",
        '["x"]',
        "--queue",
        "q1",
        "--limit",
        "exports",
        "--wait",
        *manager.cli(),
    )
    assert done.returncode == 0 and '"x"' in done.stdout, done
    refused = procs.run("submit", "jobs:stamp", "--limit", "nope", *manager.cli())
    assert refused.returncode != 0 and "unknown limit 'nope'" in refused.stderr
    assert "exports" in refused.stderr
    bad = procs.run("serve", "--limit", "exports=2/d")
    assert bad.returncode != 0 and "limit exports" in bad.stderr


# ------------------------------------------------------------------------------ limits


@pytest.mark.parametrize("with_store", [False, True], ids=["memory", "sqlite"])
def test_at_most_two_exports_run_at_once_while_other_jobs_flow(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, with_store: bool
) -> None:
    store = str(tmp_path / "jobs.db") if with_store else None
    s = make_scheduler(workers=4, limits={"exports": 2}, store=store)
    log = tmp_path / "exports.log"
    exports = [s.schedule(jobs.span, str(log), 0.3, limit="exports") for _ in range(20)]
    others_log = tmp_path / "others.log"
    others = [s.submit(jobs.span, str(others_log), 0.05) for _ in range(20)]
    for f in others:
        f.result(RESULT)
    assert sum(f.done() for f in exports) < 20  # the others did not wait for them
    for f in exports:
        f.result(RESULT)
    assert most_at_once(spans(log)) == 2
    other_spans = spans(others_log)
    assert max(e for _, e in other_spans) < max(e for _, e in spans(log))


def test_a_waiting_job_says_what_it_waits_for(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, fifo: str
) -> None:
    s = make_scheduler(workers=2, limits={"exports": 1})
    running = s.schedule(jobs.announce_then_sleep, fifo, 1.0, limit="exports")
    with open(fifo) as announced:
        announced.readline()
    held = s.schedule(jobs.stamp, limit="exports")
    deadline = time.monotonic() + RESULT
    while s.job_info(held.job_id).waiting_for is None and time.monotonic() < deadline:
        time.sleep(0.02)
    info = s.job_info(held.job_id)
    assert (info.state, info.limit, info.waiting_for, info.attempts) == (
        "pending",
        "exports",
        "limit exports",
        0,
    )
    running.result(RESULT)
    held.result(RESULT)


def test_an_unknown_limit_fails_at_the_call_site(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(workers=1, limits={"exports": 2, "api": "10/s"})
    with pytest.raises(InvalidJobError, match=r"unknown limit 'nope'.*api, exports"):
        s.schedule(jobs.stamp, limit="nope")
    with pytest.raises(InvalidJobError, match="queue name"):
        s.schedule(jobs.stamp, queue="no spaces")


def test_set_limit_at_run_time_is_kept_in_the_store(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = str(tmp_path / "jobs.db")
    s = make_scheduler(workers=1, store=store)
    s.set_limit("exports", concurrency=2, rate="5/m")
    assert s.limits() == {"exports": "2,5/m"}
    assert s.schedule(jobs.stamp, "x", limit="exports").result(RESULT)[0] == "x"
    s.shutdown()
    again = make_scheduler(workers=1, store=store)
    assert again.limits() == {"exports": "2,5/m"}
    again.set_limit("exports", concurrency=None, rate=None)
    assert again.limits() == {"exports": ""}


def test_fifty_jobs_under_ten_a_second(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    s = make_scheduler(workers=4, limits={"api": "10/s"})
    log = tmp_path / "api.log"
    began = time.monotonic()
    futures = [s.schedule(jobs.span, str(log), 0.0, limit="api") for _ in range(50)]
    for f in futures:
        f.result(RESULT)
    took = time.monotonic() - began
    starts = sorted(start for start, _ in spans(log))
    # the worker starts a job a moment after the manager admits it: a small margin
    assert max(sum(1 for s in starts if t <= s < t + 0.9) for t in starts) <= 10
    assert 3.9 < took < 12.0


def test_queue_limit_and_limits_survive_a_sigkill_with_sqlite(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store, queues=["default"], limits={"exports": 1})
    held = s.schedule(jobs.stamp, "r", queue="reports", limit="exports")
    assert s.job_info(held.job_id).state == "pending"  # sent, and committed
    pid = s._manager_process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    s._manager_process.join(RESULT)
    again = make_scheduler(workers=1, store=store, queues=["reports"])
    assert again.limits() == {"exports": "1"}
    info = again.job_info(held.job_id)
    assert (info.queue, info.limit) == ("reports", "exports")
    assert again.job(held.job_id).result(RESULT)[0] == "r"


def test_metrics_and_the_page_show_each_queue_and_its_workers(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(workers=1, queues=["default"], limits={"exports": 2}, http=0)
    assert s.http_url is not None
    waiting = s.schedule(jobs.stamp, queue="reports")
    assert s.job_info(waiting.job_id).state == "pending"
    with urllib.request.urlopen(s.http_url + "/metrics", timeout=RESULT) as answer:
        metrics = answer.read().decode()
    assert 'mpsched_queue_pending{queue="reports"} 1' in metrics
    assert 'mpsched_queue_workers{queue="reports"} 0' in metrics
    assert 'mpsched_queue_workers{queue="default"} 1' in metrics
    with urllib.request.urlopen(s.http_url + "/api/dashboard", timeout=RESULT) as answer:
        page = json.loads(answer.read())
    assert {"name": "reports", "pending": 1, "workers": 0} in page["queues"]
    assert page["limits"] == [["exports", "2"]]
    s.cancel(waiting.job_id)


def test_a_job_run_again_after_its_worker_died_takes_a_slot_each_time(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    s = make_scheduler(workers=2, limits={"x": 1})
    log = tmp_path / "x.log"
    again = s.schedule(jobs.die_once, str(tmp_path / "marker"), retries=1, limit="x")
    others = [s.schedule(jobs.span, str(log), 0.1, limit="x") for _ in range(4)]
    assert again.result(RESULT) is not None
    for f in others:
        f.result(RESULT)
    assert s.job_info(again.job_id).attempts == 2
    assert most_at_once(spans(log)) == 1


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_each_attempt_of_a_job_retried_on_exception_takes_a_slot(
    make_scheduler: Callable[..., Scheduler],
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    store = request.getfixturevalue("redis_url") if kind == "redis" else None
    s = make_scheduler(workers=2, limits={"x": 1}, store=store)
    failing, log = str(tmp_path / "failing.log"), tmp_path / "x.log"
    retried = s.schedule(
        retry_jobs.slow_fail, failing, 0.2, limit="x", retry=RetryPolicy(2, backoff=0.0)
    )
    others = [s.schedule(jobs.span, str(log), 0.2, limit="x") for _ in range(3)]
    with pytest.raises(Exception, match="slow"):
        retried.result(RESULT)
    for f in others:
        f.result(RESULT)
    attempts = [(start, start + 0.2) for start in retry_jobs.starts(failing)]
    assert len(attempts) == 3
    assert most_at_once(attempts + spans(log)) == 1


def test_a_requeued_job_keeps_its_queue_and_limit(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    s = make_scheduler(workers=1, queues=["reports"], limits={"x": 1})
    failed = s.schedule(jobs.fail, "once", queue="reports", limit="x")
    with pytest.raises(ValueError):
        failed.result(RESULT)
    again = s.requeue(failed.job_id)
    with pytest.raises(ValueError):
        again.result(RESULT)
    info = s.job_info(failed.job_id)
    assert (info.queue, info.limit) == ("reports", "x")
