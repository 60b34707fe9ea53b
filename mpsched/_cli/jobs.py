"""The commands that read and change a running manager's jobs: jobs, cancel, result.

Each connects, asks, prints and returns an exit code (:class:`mpsched._protocol.records.Exit`);
``main()`` in :mod:`mpsched._cli.main` turns their errors into one line. Results go to stdout
as JSON (or as their repr, said on stderr, when JSON cannot hold them), messages and a
failed job's worker traceback to stderr, so a script can read one and show the other.
Times print as the wait ("in 3 min 05 s", "overdue by 1.2 s") and the local wall-clock
time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from typing import Any, TextIO

from mpsched._cli.connection import connected
from mpsched._cli.formats import format_duration, local_time
from mpsched._client.client import Client
from mpsched._client.job_future import JobFuture
from mpsched._core.job import JobInfo, JobState
from mpsched._errors import (
    InvalidJobError,
    JobNotFoundError,
    RemoteTraceback,
    ScheduleNotFoundError,
)
from mpsched._protocol.records import (
    Exit,
)

# ``result`` of a job that has not finished: 124, as timeout(1) exits when its command did
# not finish in time (without --wait the time was zero).
NOT_FINISHED = Exit.JOB_TIMEOUT


def as_json(value: Any) -> str | None:
    """``value`` as JSON, or None when JSON cannot hold it (a set, an object, a NaN)."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def print_result(job_id: str, result: Any, out: TextIO) -> None:
    """A job's result on ``out``: as JSON, or its repr, said on stderr."""
    shown = as_json(result)
    if shown is None:
        shown = repr(result)
        print(
            f"mpsched: job {job_id} returned a {type(result).__qualname__}, which JSON "
            f"cannot hold: its repr follows",
            file=sys.stderr,
        )
    print(shown, file=out)


def print_failure(job_id: str, error: BaseException) -> None:
    """Why a job failed, on stderr: its error, then the worker's traceback if any."""
    print(f"job {job_id} failed: {type(error).__name__}: {error}", file=sys.stderr)
    traceback = worker_traceback(error)
    if traceback:
        print(f"the worker's traceback:\n{traceback.rstrip()}", file=sys.stderr)


def worker_traceback(error: BaseException) -> str | None:
    """The traceback the worker formatted for a job's error; None when there is none (the
    worker crashed, the job timed out or was cancelled)."""
    cause = error.__cause__
    return cause.traceback if isinstance(cause, RemoteTraceback) else None


def print_outcome(future: JobFuture[Any], out: TextIO) -> int:
    """Wait for the job; print its result, or why it failed (exit 1)."""
    try:
        result = future.result()
    except Exception as exc:
        print_failure(future.job_id, exc)
        return Exit.FAILURE
    print_result(future.job_id, result, out)
    return Exit.OK


# ------------------------------------------------------------------------------ jobs


def run_jobs(args: argparse.Namespace, out: TextIO) -> int:
    """The ``jobs`` command."""
    with connected(args) as client:
        listed = client.jobs(args.state, args.limit)
    now = time.time()
    if args.json:
        json.dump([job_as_dict(job, now) for job in listed], out, indent=2)
        out.write("\n")
    else:
        out.write(format_jobs(listed, now))
    return Exit.OK


def job_as_dict(job: JobInfo, now: float) -> dict[str, Any]:
    """What ``jobs --json`` prints of one job: due in UTC ISO 8601, due_in in seconds."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state,
        "due": job.due.isoformat(),
        "due_in": job.due.timestamp() - now,
        "priority": job.priority.name.lower(),
        "attempts": job.attempts,
        "worker": job.worker,
        "key": job.key,
        "progress": job.progress,
        "error": job.error,
        "waiting_for": job.waiting_for,
    }


def format_jobs(jobs: list[JobInfo], now: float) -> str:
    """The table ``jobs`` prints: one line per job, due as local time and the wait."""
    if not jobs:
        return "no jobs\n"
    rows = [
        ("id", "name", "state", "due", "priority", "attempts", "worker", "progress", "last error")
    ]
    rows += [
        (
            job.job_id,
            job.name,
            job.state if job.waiting_for is None else f"{job.state}, {job.waiting_for}",
            format_when(job, now),
            job.priority.name.lower(),
            str(job.attempts),
            job.worker or "-",
            format_progress(job.progress),
            job.error or "-",
        )
        for job in jobs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + f"  {row[-1]}"
        for row in rows
    ]  # the last column unpadded: no trailing blanks
    return "\n".join(lines) + "\n"


def format_progress(progress: float | dict[str, Any] | None, width: int = 40) -> str:
    """``42%`` for a number, the dict as compact JSON (cut to ``width``), ``-`` for none."""
    if progress is None:
        return "-"
    if isinstance(progress, float):
        return f"{progress:.0%}"
    text = json.dumps(progress, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def format_when(job: JobInfo, now: float) -> str:
    """``2026-12-03T09:28:11+01:00 (in 3 min 05 s)``; a pending job past its due time is
    ``overdue by``, any other job's past due time is ``... ago``."""
    due_in = job.due.timestamp() - now
    if due_in >= 0:
        wait = f"in {format_duration(due_in)}"
    elif job.state == JobState.PENDING:
        wait = f"overdue by {format_duration(-due_in)}"
    else:
        wait = f"{format_duration(-due_in)} ago"
    when = local_time(job.due.timestamp())
    return wait if when is None else f"{when} ({wait})"


# ------------------------------------------------------------------------------ cancel


def run_cancel(args: argparse.Namespace, out: TextIO) -> int:
    """The ``cancel`` command: 0 when the job was pending and is now cancelled (or the id
    names a schedule, now cancelled), else 1."""
    with connected(args) as client:
        try:
            schedule = client.get_schedule(args.job_id)
        except ScheduleNotFoundError:
            schedule = None
        if schedule is not None and schedule.cancel():
            print(f"cancelled schedule {args.job_id}; a run under way finishes", file=out)
            return Exit.OK
        if schedule is not None:  # another client cancelled it meanwhile
            print(
                f"mpsched: schedule {args.job_id} was not cancelled: it was cancelled already",
                file=sys.stderr,
            )
            return Exit.FAILURE
        if client.cancel(args.job_id):
            print(f"cancelled job {args.job_id}", file=out)
            return Exit.OK
        why = _not_pending(client, args.job_id)
    print(f"mpsched: job {args.job_id} was not cancelled: {why}", file=sys.stderr)
    return Exit.FAILURE


def _not_pending(client: Client, job_id: str) -> str:
    """Why a job that ``cancel`` did not take out was not pending."""
    try:
        future = client.job(job_id)
    except JobNotFoundError:
        return "no such schedule, and " + _UNKNOWN
    state = unfinished_state(client, future)
    if state is JobState.RUNNING:
        return "it is running (a worker took it)"
    if state is JobState.PENDING:  # taken and put back (a retry) while we asked
        return "it was being handed to a worker; try again"
    if future.cancelled():
        return "it was cancelled already"
    error = future.exception()
    if error is not None:
        return f"it has finished: it failed ({type(error).__name__})"
    return "it has finished: it is done"


_UNKNOWN = (
    "no such job: unknown, or finished and forgotten (serve keeps outcomes for "
    "--result-ttl seconds; without --store, in memory, at most 100,000 jobs)"
)


def unfinished_state(client: Client, future: JobFuture[Any]) -> JobState | None:
    """PENDING or RUNNING while the job of ``future`` (from ``client.job()``) has not
    finished; None once it has, with ``future`` resolved.

    ``client.job()`` returns a finished job's future done; for any other the manager is
    asked for the job's state by its id, and when it no longer knows the job (it ended
    meanwhile and was forgotten) the outcome on its way is awaited.
    """
    while not future.done():
        try:
            state: JobState | None = JobState(client.job_info(future.job_id).state)
        except JobNotFoundError:  # it ended (and was forgotten): its outcome is on its way
            state = None
        if state is JobState.PENDING or state is JobState.RUNNING:
            return state
        concurrent.futures.wait([future], timeout=1.0)
    return None


# ------------------------------------------------------------------------------ requeue


def run_requeue(args: argparse.Namespace, out: TextIO) -> int:
    """The ``requeue`` command: 0 when the failed or cancelled job is pending again (its
    id printed), else 1 and why on stderr."""
    with connected(args) as client:
        try:
            client.requeue(args.job_id)
        except JobNotFoundError:
            why = _UNKNOWN
        except InvalidJobError as exc:
            why = str(exc).removeprefix(f"job {args.job_id} cannot be requeued: ")
        else:
            print(args.job_id, file=out)
            return Exit.OK
    print(f"mpsched: job {args.job_id} was not requeued: {why}", file=sys.stderr)
    return Exit.FAILURE


# ------------------------------------------------------------------------------ result


def run_result(args: argparse.Namespace, out: TextIO) -> int:
    """The ``result`` command: 0 done, 1 failed, cancelled or unknown, 124 unfinished."""
    with connected(args) as client:
        try:
            future = client.job(args.job_id)
        except JobNotFoundError:
            return _say_result(args, out, None, Exit.FAILURE, message=_UNKNOWN)
        if args.wait:
            concurrent.futures.wait([future], timeout=args.timeout)
        state = unfinished_state(client, future)
        if state is not None:
            hint = "" if args.wait else "; --wait waits for it"
            return _say_result(
                args, out, state, NOT_FINISHED, message=f"it is {state}: no result yet{hint}"
            )
    if future.cancelled():
        return _say_result(
            args,
            out,
            JobState.CANCELLED,
            Exit.FAILURE,
            message="it was cancelled: it has no result",
        )
    error = future.exception()
    if error is not None:
        return _say_result(args, out, JobState.FAILED, Exit.FAILURE, error=error)
    return _say_result(args, out, JobState.DONE, Exit.OK, result=future.result())


def _say_result(
    args: argparse.Namespace,
    out: TextIO,
    state: JobState | None,
    code: int,
    *,
    message: str = "",
    error: BaseException | None = None,
    result: Any = None,
) -> int:
    """Print what ``result`` found of a job (its state; None: the job is unknown), as a
    JSON object with --json; return ``code``."""
    if args.json:
        shown: dict[str, Any] = {
            "job_id": args.job_id,
            "state": "unknown" if state is None else str(state),
        }
        if state is JobState.DONE:
            if as_json(result) is None:
                shown["result_repr"] = repr(result)
            else:
                shown["result"] = result
        elif error is not None:
            shown["error"] = {
                "type": type(error).__name__,
                "message": str(error),
                "traceback": worker_traceback(error),
            }
        print(json.dumps(shown), file=out)
    elif state is JobState.DONE:
        print_result(args.job_id, result, out)
    elif error is not None:
        print_failure(args.job_id, error)
    if message:
        print(f"mpsched: job {args.job_id}: {message}", file=sys.stderr)
    return code
