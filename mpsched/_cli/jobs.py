"""The commands that read and change a running manager's jobs: status, jobs, cancel, result.

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
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TextIO

from mpsched._cli.parser import plural
from mpsched._client.client import Client, connect
from mpsched._client.futures import JobFuture
from mpsched._core.job import JobInfo
from mpsched._errors import (
    JobNotFoundError,
    ManagerUnreachableError,
    RemoteTraceback,
    ScheduleNotFoundError,
)
from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    Exit,
    Stats,
)
from mpsched._transport.runtime import default_address, require_authkey
from mpsched._transport.sockets import Address, format_address, parse_address

# ``result`` of a job that has not finished: 124, as timeout(1) exits when its command did
# not finish in time (without --wait the time was zero).
NOT_FINISHED = Exit.JOB_TIMEOUT


def manager_of(args: argparse.Namespace) -> tuple[Address, bytes]:
    """The manager a client command talks to and its key: ``--connect`` (default: this
    user's local manager) with ``--authkey-file``, else $MPSCHED_AUTHKEY, else (for a local
    address) this user's local key.

    Raises:
        AddressError: ``--connect`` does not parse.
        AuthenticationError: no key, or an unsafe key file or runtime directory.
        ManagerUnreachableError: no address given, and no local manager has ever run.
    """
    address = parse_address(args.connect) if args.connect else default_address()
    return address, require_authkey(address, args.authkey_file,
                                    give="give --authkey-file (mode 0600)")


def service_at(address: Address, key: bytes) -> ServiceProxy:
    """``connect_service``, with a failure to reach a manager said as what it was.

    Raises:
        ManagerUnreachableError: unknown host, nothing listening, or not a manager.
        AuthenticationError: the manager refused the key.
    """
    try:
        return connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (EOFError, OSError, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[Client]:
    """A client of ``--connect``, detached on the way out: it leaves every job queued."""
    address, key = manager_of(args)
    client = connect(address, authkey=key)
    try:
        yield client
    finally:
        client.detach()


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
        print(f"mpsched: job {job_id} returned a {type(result).__qualname__}, which JSON "
              f"cannot hold: its repr follows", file=sys.stderr)
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


# ------------------------------------------------------------------------------ status


def run_status(args: argparse.Namespace, out: TextIO) -> int:
    """The ``status`` command."""
    address, key = manager_of(args)
    stats = service_at(address, key).stats()
    if args.json:
        json.dump(dataclasses.asdict(stats), out, indent=2)
        out.write("\n")
    else:
        out.write(format_stats(stats, format_address(address), time.time()))
    return Exit.OK


def format_stats(stats: Stats, where: str, now: float) -> str:
    """The text ``status`` prints; ``now`` (epoch seconds) dates the next due job."""
    q = stats.queue
    ms = {k: f"{v * 1000:.1f} ms" for k, v in q.lateness.items()}
    lines = [
        f"manager {where}, up {format_duration(stats.uptime)}",
        f"store     {format_store(stats.store, stats.store_size)}",
        f"pending   high {q.pending['high']}  medium {q.pending['medium']}  "
        f"low {q.pending['low']}   in flight {q.in_flight}   "
        f"next job {format_due(q.next_due_in, now)}",
        f"done      completed {q.completed}  failed {q.failed}  cancelled {q.cancelled}  "
        f"retried {q.retried}  timed out {q.timed_out}   {stats.throughput:.1f} jobs/s",
        f"lateness  p50 {ms['p50']}  p90 {ms['p90']}  p99 {ms['p99']}  max {ms['max']}  "
        f"({plural(q.lateness_samples, 'job')})",
        f"workers   {len(stats.workers)}",
        f"  {'id':<14} {'host':<16} {'pid':>7} {'cpu%':>6} {'rss MB':>7} {'done':>6}  current",
    ]
    for w in stats.workers:
        lines.append(f"  {w.worker_id:<14} {w.host:<16} {w.pid:>7} {w.cpu_percent:>6.1f} "
                     f"{w.rss / 2**20:>7.1f} {w.jobs_done:>6}  {w.current_job or '-'}")
    return "\n".join(lines) + "\n"


def format_store(location: str, size: int | None) -> str:
    """``/var/lib/jobs.db, 1.2 MiB`` or ``memory (jobs end with the manager)``."""
    if location == "memory":
        return "memory (jobs end with the manager; serve --store FILE keeps them)"
    return location if size is None else f"{location}, {format_size(size)}"


def format_size(size: int) -> str:
    """``512 bytes``, ``12.0 KiB``, ``1.2 MiB``, ``3.4 GiB``."""
    if size < 1024:
        return f"{size} bytes"
    value, units = size / 1024, ["KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}"


def format_due(due_in: float | None, now: float) -> str:
    """``due in 3 h 02 min (2026-12-03T09:28:11+01:00)`` or ``overdue by 1.2 s (...)``:
    the wait, then the local wall-clock time; "-" for no job."""
    if due_in is None:
        return "-"
    wait = f"due in {format_duration(due_in)}" if due_in >= 0 else \
        f"overdue by {format_duration(-due_in)}"
    when = local_time(now + due_in)
    return wait if when is None else f"{wait} ({when})"


def local_time(epoch: float) -> str | None:
    """``2026-12-03T09:28:11+01:00``; None past the year 9999 (no date to show)."""
    try:
        return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return None


def format_duration(seconds: float) -> str:
    """``350 ms``, ``1.2 s``, ``4 min 05 s``, ``3 h 02 min``, ``12 d 04 h``; capped at a
    century, so that no time prints as a 300-digit number."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds >= 100 * 365.25 * 86400:
        return "more than 100 years"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


# ------------------------------------------------------------------------------ jobs


def run_jobs(args: argparse.Namespace, out: TextIO) -> int:
    """The ``jobs`` command."""
    with connected(args) as client:
        listed = client.jobs(args.state)
    now = time.time()
    if args.json:
        json.dump([job_as_dict(job, now) for job in listed], out, indent=2)
        out.write("\n")
    else:
        out.write(format_jobs(listed, now))
    return Exit.OK


def job_as_dict(job: JobInfo, now: float) -> dict[str, Any]:
    """What ``jobs --json`` prints of one job: due in UTC ISO 8601, due_in in seconds."""
    return {"job_id": job.job_id, "name": job.name, "state": job.state,
            "due": job.due.isoformat(), "due_in": job.due.timestamp() - now,
            "priority": job.priority.name.lower(), "attempts": job.attempts,
            "worker": job.worker, "key": job.key}


def format_jobs(jobs: list[JobInfo], now: float) -> str:
    """The table ``jobs`` prints: one line per job, due as local time and the wait."""
    if not jobs:
        return "no jobs\n"
    rows = [("id", "name", "state", "due", "priority", "attempts", "worker")]
    rows += [(job.job_id, job.name, job.state, format_when(job, now),
              job.priority.name.lower(), str(job.attempts), job.worker or "-")
             for job in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
             + f"  {row[-1]}" for row in rows]  # the last column unpadded: no trailing blanks
    return "\n".join(lines) + "\n"


def format_when(job: JobInfo, now: float) -> str:
    """``2026-12-03T09:28:11+01:00 (in 3 min 05 s)``; a pending job past its due time is
    ``overdue by``, any other job's past due time is ``... ago``."""
    due_in = job.due.timestamp() - now
    if due_in >= 0:
        wait = f"in {format_duration(due_in)}"
    elif job.state == "pending":
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
            print(f"mpsched: schedule {args.job_id} was not cancelled: it was cancelled "
                  f"already", file=sys.stderr)
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
    if state == "running":
        return "it is running (a worker took it)"
    if state == "pending":  # taken and put back (a retry) while we asked
        return "it was being handed to a worker; try again"
    if future.cancelled():
        return "it was cancelled already"
    error = future.exception()
    if error is not None:
        return f"it has finished: it failed ({type(error).__name__})"
    return "it has finished: it is done"


_UNKNOWN = ("no such job: unknown, or finished and forgotten (serve keeps outcomes for "
            "--result-ttl seconds; without --store, in memory, at most 100,000 jobs)")


def unfinished_state(client: Client, future: JobFuture[Any]) -> str | None:
    """"pending" or "running" while the job of ``future`` (from ``client.job()``) has not
    finished; None once it has, with ``future`` resolved.

    ``client.job()`` returns a finished job's future done; for any other the manager is
    asked for the job's state by its id, and when it no longer knows the job (it ended
    meanwhile and was forgotten) the outcome on its way is awaited.
    """
    while not future.done():
        try:
            state = client.job_info(future.job_id).state
        except JobNotFoundError:  # it ended (and was forgotten): its outcome is on its way
            state = ""
        if state in ("pending", "running"):
            return state
        concurrent.futures.wait([future], timeout=1.0)
    return None


# ------------------------------------------------------------------------------ result


def run_result(args: argparse.Namespace, out: TextIO) -> int:
    """The ``result`` command: 0 done, 1 failed, cancelled or unknown, 124 unfinished."""
    with connected(args) as client:
        try:
            future = client.job(args.job_id)
        except JobNotFoundError:
            return _say_result(args, out, "unknown", Exit.FAILURE, message=_UNKNOWN)
        if args.wait:
            concurrent.futures.wait([future], timeout=args.timeout)
        state = unfinished_state(client, future)
        if state is not None:
            hint = "" if args.wait else "; --wait waits for it"
            return _say_result(args, out, state, NOT_FINISHED,
                               message=f"it is {state}: no result yet{hint}")
    if future.cancelled():
        return _say_result(args, out, "cancelled", Exit.FAILURE,
                           message="it was cancelled: it has no result")
    error = future.exception()
    if error is not None:
        return _say_result(args, out, "failed", Exit.FAILURE, error=error)
    return _say_result(args, out, "done", Exit.OK, result=future.result())


def _say_result(args: argparse.Namespace, out: TextIO, state: str, code: int, *,
                message: str = "", error: BaseException | None = None,
                result: Any = None) -> int:
    """Print what ``result`` found, as a JSON object with --json; return ``code``."""
    if args.json:
        shown: dict[str, Any] = {"job_id": args.job_id, "state": state}
        if state == "done":
            if as_json(result) is None:
                shown["result_repr"] = repr(result)
            else:
                shown["result"] = result
        elif error is not None:
            shown["error"] = {"type": type(error).__name__, "message": str(error),
                              "traceback": worker_traceback(error)}
        print(json.dumps(shown), file=out)
    elif state == "done":
        print_result(args.job_id, result, out)
    elif error is not None:
        print_failure(args.job_id, error)
    if message:
        print(f"mpsched: job {args.job_id}: {message}", file=sys.stderr)
    return code
