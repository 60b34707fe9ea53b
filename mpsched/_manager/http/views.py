"""What the status server answers, as JSON-ready dicts and Prometheus text.

Every view reads copies: the service's ``stats()``, the head of the heap
(``JobQueue.head``, O(n log n) for n jobs shown, whatever is pending), the jobs in flight,
the latest failures, the schedules' listing. Each of those takes its owner's lock for the
time of a copy; the serialising and the socket work happen outside, in the request's own
thread, so a slow client never holds anything the scheduler needs.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import platform
import time
from datetime import datetime, timezone
from typing import Any

import psutil

from mpsched._core.histogram import HistogramSnapshot
from mpsched._core.job import Job, JobRecord, JobState, Priority
from mpsched._core.leases import Running
from mpsched._core.progress import decode_progress
from mpsched._core.recurring import ScheduleInfo
from mpsched._manager.failures import Failure, described
from mpsched._manager.http.history import LatenessHistory
from mpsched._manager.http.metrics import MetricsInput, ProcessFigures, render
from mpsched._manager.journal import decode
from mpsched._manager.service import ManagerService
from mpsched._protocol.records import stats_json

PAGE_HEAD = 20  # pending jobs the page lists: the next ones due, never the whole heap
DEFAULT_LIMIT = 100  # jobs /api/jobs lists without limit=
MAX_LIMIT = 1000

JsonDict = dict[str, Any]


class Views:
    """The answers of one manager's status server."""

    def __init__(self, service: ManagerService, history: LatenessHistory) -> None:
        self._service = service
        self._queue = service.queue
        self.history = history
        self._started_wall = time.time() - service.stats(lateness=False).uptime
        self._process = psutil.Process()  # this one: the manager's
        self._build = {"version": _version(), "python": platform.python_version()}

    def status(self) -> JsonDict:
        """What ``status --json`` prints."""
        return stats_json(self._service.stats())

    def metrics(self) -> str:
        store = self._service.journal.store
        return render(
            MetricsInput(
                stats=self._service.stats(lateness=False),
                lateness=self._queue.leases.lateness_histogram(),
                schedules=self._service.schedules.listing(),
                commit_latency=store.commit_latency(),
                started_wall=self._started_wall,
                process=self._process_figures(),
                build=self._build,
            )
        )

    def _process_figures(self) -> ProcessFigures | None:
        """The manager process's CPU time, memory and descriptors, read now (one
        look at /proc)."""
        try:
            with self._process.oneshot():
                times = self._process.cpu_times()
                return ProcessFigures(
                    cpu_seconds=times.user + times.system,
                    rss=self._process.memory_info().rss,
                    open_fds=self._process.num_fds(),
                    start_time=self._process.create_time(),
                )
        except (psutil.Error, OSError):  # e.g. no descriptor left to read /proc with
            return None

    def dashboard(self, *, actions: bool) -> JsonDict:
        """Everything the page shows, in one answer."""
        stats = self._service.stats(lateness=False)  # the chart has the lateness
        q = stats.queue
        self.history.tick()
        recent, covered = self.history.recent()
        return {
            "now": time.time(),
            "actions": actions,
            "manager": {
                "host": self._service.host,
                "uptime": stats.uptime,
                "store": stats.store,
                "store_size": stats.store_size,
                "clients": stats.clients,
                "throughput": stats.throughput,
            },
            "counts": {
                "pending": {p.name: q.pending[p.name.lower()] for p in Priority},
                "running": q.in_flight,
                "submitted": q.submitted,
                "done": q.completed,
                "failed": q.failed - q.crashed - q.timed_out,
                "crashed": q.crashed,
                "timeout": q.timed_out,
                "cancelled": q.cancelled,
                "retried": q.retried_all,
                "next_due_in": q.next_due_in,
            },
            "chart": chart(recent, covered),
            "workers": [dataclasses.asdict(w) for w in stats.workers],
            "workers_missing": stats.workers_missing,
            "queues": [q._asdict() for q in stats.queues],
            "limits": [list(limit) for limit in stats.limits],
            "pending": [self._pending(job) for job in self._queue.head(PAGE_HEAD)],
            "waiting": self._waiting(PAGE_HEAD),
            "running": [self._running(r) for r in self._running_jobs()],
            "failures": [failure_json(f) for f in self._service.failures.latest()],
            "schedules": [schedule_json(s) for s in self._service.schedules.listing()],
        }

    def jobs(self, state: JobState | None, limit: int) -> list[JsonDict]:
        """Up to ``limit`` jobs: running ones (by start), pending ones (the next due
        first: the heap's head, never the whole heap), or ended ones (from the journal);
        with no state, the running ones then the pending ones."""
        listed: list[JsonDict] = []
        if state in (None, JobState.RUNNING):
            listed += [self._running(r) for r in self._running_jobs()[:limit]]
        if state in (None, JobState.PENDING):
            listed += [self._pending(j) for j in self._queue.head(limit - len(listed))]
            listed += self._waiting(limit - len(listed))
        if state is not None and state.finished:
            listed = [
                record_json(described(r)) for r in self._service.journal.jobs(state.value, limit)
            ]
        return listed

    def job(self, job_id: str) -> JsonDict | None:
        """One job the manager knows, with its error and traceback if it failed."""
        record = self._service.journal.get(job_id, fresh=True)
        if record is None:
            return None
        shown = record_json(record)
        if record.state is JobState.RUNNING:
            for running in self._running_jobs():
                if running.job.job_id == job_id:
                    shown["running_for"] = self._running(running)["running_for"]
        if record.outcome is not None:
            outcome = decode(record.outcome)
            shown.update(error=outcome.error_kind or None, traceback=outcome.traceback or None)
            failed = described(record)
            if failed.error is not None:  # its error in one line, not only its kind
                shown["error"] = failed.error
        for failure in self._service.failures.latest():
            if failure.job_id == job_id:
                shown.update(error=failure.error, traceback=failure.traceback or None)
                break
        return shown

    def _running_jobs(self) -> list[Running]:
        return sorted(self._queue.leases.running(), key=lambda r: r.taken)

    def _pending(self, job: Job) -> JsonDict:
        due_in = job.due - self._queue.clock.now()
        return {
            **_job_fields(
                job.job_id,
                job.name,
                job.priority,
                time.time() + due_in,
                job.attempt,
                job.key,
                job.error,
                job.progress,
            ),
            "state": "pending",
            "due_in": due_in,
            "worker": None,
        }

    def _waiting(self, limit: int) -> list[JsonDict]:
        """Up to ``limit`` jobs that wait for their parents, in submission order."""
        workflows = self._service.workflows
        if workflows is None or not len(workflows) or limit <= 0:
            return []
        waiting = sorted(workflows.listing(), key=lambda entry: entry[0].seq)[:limit]
        return [{**self._pending(job), "waiting_for": f"after {n} jobs"} for job, n in waiting]

    def _running(self, running: Running) -> JsonDict:
        job = running.job
        now = self._queue.clock.now()
        return {
            **_job_fields(
                job.job_id,
                job.name,
                job.priority,
                time.time() + job.due - now,
                job.attempt,
                job.key,
                job.error,
                job.progress,
            ),
            "state": "running",
            "worker": running.lease.worker_id,
            "running_for": max(0.0, now - max(running.taken, job.due)),
            "timeout": job.timeout,
        }


def _job_fields(
    job_id: str,
    name: str,
    level: int,
    due_wall: float,
    attempts: int,
    key: str | None,
    error: str | None,
    progress: str | None,
) -> JsonDict:
    """The fields every listed job has, named as ``jobs --json`` names them; ``error``:
    the last error's one line; ``progress``: the latest the job reported."""
    return {
        "job_id": job_id,
        "name": name,
        "priority": Priority(level).name.lower(),
        "due": iso(due_wall),
        "attempts": attempts,
        "key": key,
        "error": error,
        "progress": decode_progress(progress),
    }


def record_json(record: JobRecord) -> JsonDict:
    """A job as the journal knows it (ended ones, and lookups by id)."""
    return {
        **_job_fields(
            record.job_id,
            record.name,
            record.priority,
            record.due_wall,
            record.attempt,
            record.key,
            record.error,
            record.progress,
        ),
        "state": record.state.value,
        "due_in": record.due_wall - time.time(),
        "worker": record.worker_id,
        "retries": record.retries,
        "timeout": record.timeout,
        "finished": None if record.finished_wall is None else iso(record.finished_wall),
    }


def failure_json(failure: Failure) -> JsonDict:
    return {
        "job_id": failure.job_id,
        "name": failure.name,
        "worker": failure.worker_id,
        "attempts": failure.attempt,
        "failed": iso(failure.failed_wall),
        "error": failure.error,
        "traceback": failure.traceback,
    }


def schedule_json(info: ScheduleInfo) -> JsonDict:
    """A schedule (``ScheduleInfo``) with its next run and its counters."""
    next_run = info.next_run
    return {
        "schedule_id": info.schedule_id,
        "spec": info.spec,
        "name": info.name,
        "paused": info.paused,
        "last_run": info.last_run,
        "next_run": None if next_run is None else next_run.isoformat(),
        "next_run_in": None if next_run is None else next_run.timestamp() - time.time(),
        **info.counters._asdict(),
    }


def chart(recent: HistogramSnapshot, covered: float) -> JsonDict:
    """The lateness histogram of the last minutes: each bucket's upper bound (seconds; the
    last is None, above every bound) and count; the buckets of the median and the p99."""
    return {
        "bounds": [*recent.bounds, None],
        "counts": list(recent.counts),
        "jobs": recent.observations,
        "seconds": covered,
        "mean": recent.total / recent.observations if recent.observations else None,
        "p50": _bound(recent.quantile(0.5)),
        "p99": _bound(recent.quantile(0.99)),
    }


def _bound(value: float | None) -> float | None:
    """A bucket bound for JSON, which has no infinity: None above every bound."""
    return None if value is None or math.isinf(value) else value


def _version() -> str:
    try:
        return importlib.metadata.version("mpsched")
    except importlib.metadata.PackageNotFoundError:  # run from a tree, not installed
        return "unknown"


def iso(epoch: float) -> str | None:
    """UTC ISO 8601 (``2026-12-03T08:28:11.250000+00:00``); None past the year 9999."""
    try:
        return datetime.fromtimestamp(epoch, timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):
        return None
