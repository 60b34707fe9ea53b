"""Where one job's time goes: each step of mpsched's path timed alone, on an idle machine.

Not a comparison: a budget. Each step runs in isolation (in this process, or as one proxy
call against an idle manager), so the numbers are floors; under load the same steps cost
more (context switches, GIL hand-offs, two cores shared by four busy processes), which the
throughput benchmark's CPU-per-job split and the py-spy profile show.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.reduction import ForkingPickler

import cloudpickle

from benchmarks._common import (
    Result,
    Section,
    alternate,
    column,
    precise_cpu_seconds,
    scheduler,
)
from benchmarks.jobs import noop
from mpsched._core.job import JobRequest, Outcome
from mpsched._core.queue import JobQueue

OPS = 2_000


def _per_op_us(step: Callable[[int], object], ops: int = OPS) -> float:
    for i in range(ops // 10):  # warm caches and allocators first
        step(-i - 1)
    start = time.perf_counter()
    for i in range(ops):
        step(i)
    return (time.perf_counter() - start) / ops * 1e6


def _request(i: int, payload: bytes) -> JobRequest:
    return JobRequest(
        job_id=f"c-{i}", client_id="c", payload=payload, priority=2, delay=0.0, at=None
    )


def in_process_steps() -> Result:
    """Steps that need no other process."""
    payload = cloudpickle.dumps((noop, (), {}))
    outcome = Outcome(
        job_id="c-1", ok=True, payload=cloudpickle.dumps(None), traceback="", started=0.0
    )
    queue = JobQueue()
    submit_us = _per_op_us(lambda i: queue.submit(_request(i, payload)))

    def take_complete(i: int) -> None:
        a = queue.take("w1", 1.0)
        assert a is not None
        queue.leases.complete(a.lease.lease_id, outcome)

    def worker_run(i: int) -> None:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = fn(*args, **kwargs)
        Outcome(
            job_id="c-1",
            ok=True,
            payload=cloudpickle.dumps(result),
            traceback="",
            started=time.monotonic(),
        )

    def resolve(i: int) -> None:
        Future().set_result(cloudpickle.loads(outcome.payload))

    message: tuple[object, ...] = (1, "submit", ([_request(1, payload)], None), {})
    wire = bytes(ForkingPickler.dumps(message))
    return {
        "client: cloudpickle the job": _per_op_us(lambda i: cloudpickle.dumps((noop, (), {}))),
        "client: pickle the submit message, ForkingPickler (multiprocessing's)": _per_op_us(
            lambda i: ForkingPickler.dumps(message)
        ),
        "client: pickle the submit message, C pickler (mpsched since ea1e8f2)": _per_op_us(
            lambda i: pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        ),
        "manager: unpickle the submit message": _per_op_us(lambda i: pickle.loads(wire)),
        "manager: JobQueue.submit": submit_us,
        "manager: JobQueue.take + complete": _per_op_us(take_complete),
        "worker: unpickle, run, pickle result": _per_op_us(worker_run),
        "client: unpickle result, resolve future": _per_op_us(resolve),
    }


def proxy_steps() -> Result:
    """Round trips to an idle manager (1 worker, no jobs running), with their CPU cost."""
    import psutil

    with scheduler(workers=1) as s:
        s.submit(noop).result()
        service = s._core.service
        manager = [psutil.Process(s._manager_process.pid)]
        cpu0, mgr0 = time.process_time(), precise_cpu_seconds(manager)
        rtt = _per_op_us(lambda i: service.cancel(f"nope-{i}"))
        calls = OPS + OPS // 10
        client_cpu = (time.process_time() - cpu0) / calls * 1e6
        manager_cpu = (precise_cpu_seconds(manager) - mgr0) / calls * 1e6
        start = time.perf_counter()
        futures = [s.schedule(noop, delay=3600.0) for _ in range(OPS)]
        submit = (time.perf_counter() - start) / OPS * 1e6
        s.shutdown(wait=True, cancel_futures=True)
        del futures
    return {
        "proxy round trip, trivial call (idle), wall": rtt,
        "… its CPU in the client": client_cpu,
        "… its CPU in the manager": manager_cpu,
        "Scheduler.schedule end to end (idle manager), wall": submit,
    }


def bench(repeats: int) -> Section:
    section = Section(
        key="breakdown",
        title="Budget of one job, step by step (isolated, idle machine)",
        setup=(
            f"Each step timed alone over {OPS:,} operations; in-process steps use "
            "mpsched's own functions (JobQueue, cloudpickle, the proxy's pickler), the "
            "round trips go to an idle manager."
        ),
    )
    results = alternate(
        [("in-process", in_process_steps), ("round trips", proxy_steps)], repeats, "breakdown"
    )
    for name, runs in results.items():
        for step in runs[0]:
            section.add(name, step, "µs", column(runs, step))
    return section
