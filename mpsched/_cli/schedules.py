"""The command line of recurring jobs: ``submit --every/--cron`` and ``schedules``."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO

from mpsched._cli.connection import connected
from mpsched._cli.formats import format_duration, local_time
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.recurring import ScheduleInfo
from mpsched._protocol.records import (
    Exit,
)

# The options of recurring jobs, with their defaults: given without --every or --cron,
# they are a usage error.
RECURRING_ONLY = {
    "tz": None,
    "schedule_id": None,
    "jitter": 0.0,
    "mode": Mode.RATE,
    "overlap": Overlap.SKIP,
    "catchup": Catchup.LATEST,
    "on_error": OnError.CONTINUE,
}


def check_recurring(args: argparse.Namespace) -> str | None:
    """What is wrong with the recurring options of ``submit``, or None."""
    recurring = args.every is not None or args.cron is not None
    if not recurring:
        given = [name for name, default in RECURRING_ONLY.items() if getattr(args, name) != default]
        if given:
            option = given[0].replace("schedule_id", "id").replace("_", "-")
            return f"--{option} needs --every" + ("" if option == "mode" else " or --cron")
        return None
    if args.wait:
        return "--wait cannot wait for a schedule: it never finishes (see schedules)"
    if args.key is not None:
        return "--key is for a single job; a schedule is named by --id, its runs by their slot"
    if args.cron is not None and (args.delay is not None or args.at is not None):
        return "--delay and --at set the first run of --every, not of --cron"
    if args.every is not None and args.tz is not None:
        return "--tz is for --cron"
    if args.cron is not None and args.mode != Mode.RATE:
        return "--mode is for --every: cron runs come at the times of the expression"
    return None


def submit_recurring(
    args: argparse.Namespace,
    fn: Callable[..., Any],
    call_args: list[Any],
    call_kwargs: dict[str, Any],
    at: datetime | None,
    out: TextIO,
) -> int:
    """Add the schedule ``submit --every/--cron`` describes; print its id and next run."""
    options: dict[str, Any] = dict(
        id=args.schedule_id,
        overlap=args.overlap,
        catchup=args.catchup,
        jitter=args.jitter,
        on_error=args.on_error,
        priority=args.priority,
        timeout=args.timeout,
        retries=args.retries,
        retry=args.retry,
        queue=args.queue,
        limit=args.limit,
    )
    with connected(args) as client:
        if args.every is not None:
            start = at if at is not None else args.delay
            schedule = client.every(
                args.every, fn, *call_args, mode=args.mode, start=start, **options, **call_kwargs
            )
        else:
            schedule = client.cron(args.cron, fn, *call_args, tz=args.tz, **options, **call_kwargs)
        info = schedule.info()
    print(info.schedule_id, file=out)
    print(f"{info.spec}, next run {_when(info, time.time())}", file=out)
    return Exit.OK


def run_schedules(args: argparse.Namespace, out: TextIO) -> int:
    """The ``schedules`` command."""
    with connected(args) as client:
        infos = [s.info() for s in client.schedules()]
    now = time.time()
    if args.json:
        json.dump([schedule_as_dict(info) for info in infos], out, indent=2)
        out.write("\n")
    elif not infos:
        out.write("no schedules\n")
    else:
        rows: list[tuple[str, ...]] = [
            ("id", "spec", "next run", "runs", "skipped", "missed", "failed")
        ]
        rows += [(i.schedule_id, i.spec, _when(i, now), *map(str, i.counters)) for i in infos]
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]) - 1)]
        out.writelines(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
            + f"  {row[-1]}\n"
            for row in rows
        )
    return Exit.OK


def schedule_as_dict(info: ScheduleInfo) -> dict[str, Any]:
    """What ``schedules --json`` prints of one schedule: times in UTC ISO 8601, the job
    id of the run armed for ``next_run`` (if one is) and of the latest run that started."""
    return {
        "id": info.schedule_id,
        "spec": info.spec,
        "name": info.name,
        "next_run": None
        if info.next_run is None
        else info.next_run.astimezone(timezone.utc).isoformat(),
        "next_run_id": info.next_run_id,
        "paused": info.paused,
        "last_run": info.last_run,
        **info.counters._asdict(),
    }


def _when(info: ScheduleInfo, now: float) -> str:
    if info.paused:
        return "paused"
    if info.next_run is None:
        return "-"
    wait = info.next_run.timestamp() - now
    relative = f"{'in ' if wait >= 0 else 'due '}{format_duration(abs(wait))}"
    local = local_time(info.next_run.timestamp())
    return relative if local is None else f"{local} ({relative})"
