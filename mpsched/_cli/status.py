"""``python -m mpsched status``: the manager's queue, workers, lateness and store, as text
or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from mpsched._cli.connection import manager_of, service_at
from mpsched._cli.formats import format_due, format_duration, format_size, plural
from mpsched._cli.managers import format_managers
from mpsched._protocol.records import Exit, Stats, stats_json
from mpsched._store.base import IN_MEMORY
from mpsched._transport.address import format_address


def run_status(args: argparse.Namespace, out: TextIO) -> int:
    """The ``status`` command."""
    address, key = manager_of(args)
    stats = service_at(address, key).stats()
    if args.json:
        json.dump(stats_json(stats), out, indent=2)
        out.write("\n")
    else:
        out.write(format_stats(stats, format_address(address), time.time()))
    for warning in unserved_queues(stats):
        print(f"mpsched: warning: {warning}", file=sys.stderr)
    return Exit.OK


def unserved_queues(stats: Stats) -> list[str]:
    """A line for each queue with pending jobs that no worker serves."""
    return [
        f"queue {q.name} has {plural(q.pending, 'pending job')} and no worker serves "
        f"it (worker --queues {q.name})"
        for q in stats.queues
        if q.pending and not q.workers
    ]


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
        f"retried {q.retried_all}  timed out {q.timed_out}   {stats.throughput:.1f} jobs/s",
        f"lateness  p50 {ms['p50']}  p90 {ms['p90']}  p99 {ms['p99']}  max {ms['max']}  "
        f"({plural(q.lateness_samples, 'job')})",
        *format_queues(stats),
        f"workers   {len(stats.workers)}",
        f"  {'id':<14} {'host':<16} {'pid':>7} {'cpu%':>6} {'rss MB':>7} {'done':>6}  current",
    ]
    for w in stats.workers:
        lines.append(
            f"  {w.worker_id:<14} {w.host:<16} {w.pid:>7} {w.cpu_percent:>6.1f} "
            f"{w.rss / 2**20:>7.1f} {w.jobs_done:>6}  {w.current_job or '-'}"
        )
    lines += format_managers(stats.managers)
    return "\n".join(lines) + "\n"


def format_queues(stats: Stats) -> list[str]:
    """The queues line (each queue's pending jobs and workers) and the limits line, when
    there is more than the default queue or any limit."""
    lines = []
    if [q.name for q in stats.queues] not in ([], ["default"]):
        lines.append(
            "queues    "
            + "  ".join(
                f"{q.name} {q.pending} ({plural(q.workers, 'worker')})" for q in stats.queues
            )
        )
    if stats.limits:
        lines.append(
            "limits    " + "  ".join(f"{name} {form or 'no bound'}" for name, form in stats.limits)
        )
    return lines


def format_store(location: str, size: int | None) -> str:
    """``/var/lib/jobs.db, 1.2 MiB`` or ``memory (jobs end with the manager)``."""
    if location == IN_MEMORY:
        return "memory (jobs end with the manager; serve --store FILE|URL keeps them)"
    return location if size is None else f"{location}, {format_size(size)}"
