"""Running one job in a worker: unpickle it, wait for its due time, call it, and turn
whatever happens into an Outcome (a worker survives any exception a job raises).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import cloudpickle

from mpsched._core.job import Assignment, Outcome, OutcomeKind
from mpsched._core.result_of import INPUTS_MAGIC, detach_inputs, job_payload, substitute
from mpsched._core.retrying import RetryFilter, RetryLater, retry_later_kind
from mpsched._errors import JobError, JobUnpicklingError, ResultPicklingError
from mpsched._payload import frames, shm
from mpsched._payload.pickling import dumps_result, loads, remote_exception
from mpsched._transport.sockets import host_name
from mpsched._worker import context
from mpsched._worker.process import WorkerConfig

if TYPE_CHECKING:
    import asyncio


def start_time(assignment: Assignment) -> float:
    """When to enter the job, on this process's monotonic clock.

    Only a worker that shares the manager's clock is sent ``due`` (an instant on it); any
    other waits the ``delay`` the manager measured, from now.
    """
    if assignment.due is not None:
        return assignment.due
    return time.monotonic() + assignment.delay


def result_segment(config: WorkerConfig, assignment: Assignment) -> str:
    """Where a large result goes: shared memory when the manager uses it and the job's
    client maps it (its payload is framed); "" for inline."""
    if config.shm_prefix and job_payload(assignment.payload)[:4] == frames.MAGIC:
        return shm.result_name(config.shm_prefix, assignment.lease.lease_id)
    return ""


def run(
    assignment: Assignment,
    start_at: float | None = None,
    result_segment: str = "",
    entering: Callable[[str], None] | None = None,
) -> Outcome:
    """Unpickle and run one job; never raises: every failure becomes an Outcome.

    The callable is entered no sooner than ``start_at`` (this process's monotonic clock;
    by default computed from the assignment now, see ``start_time``). With
    ``result_segment``, the result's large buffers go to that shared-memory segment.
    ``entering`` is called with the job id right before the callable is.
    """
    job_id = assignment.lease.job_id
    try:
        payload = assignment.payload
        inputs = None
        if payload[:4] == INPUTS_MAGIC:  # a job after others, with their outcomes
            inputs, payload = detach_inputs(payload)
        fn, args, kwargs = loads(payload)
        if isinstance(fn, bytes):  # map(): the callable was pickled once, separately
            fn = cloudpickle.loads(fn)
        if inputs:
            args, kwargs = substitute(args, kwargs, _values(inputs))
        retry_filter = None
        if type(fn) is RetryFilter:  # a job with a retry policy
            retry_filter, fn = fn, fn.fn
    except BaseException as exc:
        unpickling = JobUnpicklingError(
            f"job {job_id}: the worker on {host_name()} (pid {os.getpid()}) could not "
            f"unpickle it: {exc!r}{_unpickling_hint(exc)}"
        )
        return _failure(job_id, unpickling, _format(exc), None, OutcomeKind.JOB_UNPICKLING)
    due = start_time(assignment) if start_at is None else start_at
    started = _wait_until(due)
    if assignment.at is not None:
        started = _wait_for_wall(assignment.at, started)
    if entering is not None:
        entering(job_id)
    context.entered(assignment, due)  # what current_job() describes
    try:
        result = fn(*args, **kwargs)
        # An async def job, or any awaitable it returned (the test of Awaitable, without
        # the cost of an ABC's isinstance on the path of every job)
        if hasattr(type(result), "__await__"):
            result = run_awaitable(result)
    except BaseException as exc:
        context.left()
        return _failure(job_id, exc, _format(exc), started, _kind(exc, retry_filter))
    context.left()
    try:
        payload = dumps_result(result, result_segment)
    except BaseException as exc:
        pickling = ResultPicklingError(
            f"job {job_id} returned a {type(result).__qualname__} that could not be pickled: "
            f"{exc!r}"
        )
        return _failure(job_id, pickling, _format(exc), started, OutcomeKind.RESULT_PICKLING)
    return Outcome(job_id=job_id, ok=True, payload=payload, traceback="", started=started)


def _values(inputs: dict[str, Outcome]) -> dict[str, Any]:
    """Each parent's result, or its exception (a job that allows failure), by job id."""
    return {
        job_id: loads(o.payload) if o.ok else remote_exception(o) for job_id, o in inputs.items()
    }


def _kind(exc: BaseException, retry_filter: RetryFilter | None) -> str:
    """The outcome kind of a job's own exception: whether the manager may run it again."""
    if isinstance(exc, RetryLater):
        return retry_later_kind(exc)
    if retry_filter is not None:
        return retry_filter.kind(exc)
    return OutcomeKind.RAISED


# The worker's event loop: made at its first async job, then kept for the process's life,
# so tasks and connections a job leaves on it are there for the next. Only the worker's
# main thread runs jobs, so nothing else touches it.
_loop: asyncio.AbstractEventLoop | None = None


def run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` to completion on this process's event loop; return its result.

    Raises what it raises. One that ends by a BaseException other than an Exception
    (SystemExit, KeyboardInterrupt) closes the loop, and the next job gets a new one.
    """
    global _loop
    import asyncio  # here: a worker that never runs an async job never imports it

    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    loop = _loop
    try:
        return loop.run_until_complete(awaitable)
    except Exception:
        raise
    except BaseException:
        _loop = None
        loop.close()
        raise


def _unpickling_hint(exc: BaseException) -> str:
    """What to do about a job whose module (or a name in it) this worker cannot import."""
    if not isinstance(exc, (ImportError, AttributeError)):
        return ""
    return (
        f". Workers import a job's functions by module name, from their working "
        f"directory and PYTHONPATH (this worker's sys.path: {sys.path}); functions from "
        f"__main__ and lambdas travel by value. For a module only the client has, send "
        f"it by value: submit --by-value MODULE on the command line, or "
        f"cloudpickle.register_pickle_by_value(module) in the submitting program before "
        f"submitting; or install the module where the workers run."
    )


def _wait_until(due: float) -> float:
    """Sleep until ``due`` (a job handed out early, see EARLY_HANDOFF); return the time.

    ``due`` is on this process's monotonic clock (see ``start_time``).
    """
    now = time.monotonic()
    while now < due:
        time.sleep(due - now)
        now = time.monotonic()
    return now


def _wait_for_wall(at: float, now: float) -> float:
    """Sleep until the wall clock reads ``at`` (a job asked for ``at=``, on the manager's
    machine: the manager held it until then, but the clocks' offset moves by microseconds
    between the hand-out and the start); return the monotonic time, ``now`` if no wait."""
    while (gap := at - time.time()) > 0:
        time.sleep(gap)
        now = time.monotonic()
    return now


def _failure(job_id: str, exc: BaseException, tb: str, started: float | None, kind: str) -> Outcome:
    if isinstance(exc, SystemExit):
        exc = JobError(f"job {job_id} called sys.exit({exc.code!r})")
    elif not isinstance(exc, Exception):
        # KeyboardInterrupt and friends must not escape into the client.
        exc = JobError(f"job {job_id} raised {type(exc).__name__}{exc.args!r}")
    try:
        payload = cloudpickle.dumps(exc)
    except BaseException:
        payload = cloudpickle.dumps(
            JobError(f"job {job_id} raised {type(exc).__qualname__}: {exc} (not picklable)")
        )
    return Outcome(
        job_id=job_id, ok=False, payload=payload, traceback=tb, started=started, error_kind=kind
    )


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
