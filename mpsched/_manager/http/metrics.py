"""The Prometheus text exposition format (version 0.0.4) of a manager's counters.

Pure: :func:`render` turns a :class:`MetricsInput` (copies of counters the manager keeps
anyway) into text; nothing here reads a clock or takes a lock. Names follow Prometheus'
conventions: an ``mpsched_`` prefix, base units in the name (``_seconds``, ``_bytes``),
``_total`` on counters, labels for dimensions (``priority``, ``outcome``, ``state``,
``host``, ``slot``, ``schedule``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mpsched._core.histogram import HistogramSnapshot
from mpsched._core.recurring import ScheduleInfo
from mpsched._protocol.records import Stats
from mpsched._store.redis.url import is_redis_url

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PRIORITIES = ("HIGH", "MEDIUM", "LOW")
OUTCOMES = ("done", "failed", "cancelled", "crashed", "timeout")

Labels = dict[str, str]
Sample = tuple[str, Labels, float]  # (suffix of its family's name, labels, value)


@dataclass(frozen=True)
class MetricsInput:
    """What one scrape shows: copies of the manager's counters, taken outside any lock."""

    stats: Stats
    lateness: HistogramSnapshot  # every job's due -> start, since the manager started
    schedules: Sequence[ScheduleInfo]
    # the store's commits (None: no store, or one that does not time its commits)
    commit_latency: HistogramSnapshot | None
    started_wall: float  # when the manager started, epoch seconds
    process: ProcessFigures | None = None  # the manager process (None: not readable)
    build: Labels | None = None  # version labels of mpsched_build_info


@dataclass(frozen=True)
class ProcessFigures:
    """The manager process itself, as every Prometheus client library's ``process_*``
    metrics show a process."""

    cpu_seconds: float  # user + system
    rss: int  # bytes
    open_fds: int
    start_time: float  # epoch seconds


def render(metrics: MetricsInput) -> str:
    """The exposition of ``metrics``: every family with its HELP and TYPE lines."""
    out = _Exposition()
    _jobs(out, metrics.stats)
    out.histogram(
        "mpsched_lateness_seconds",
        "Seconds from a job's due time to its start, "
        "for every job run by a worker that shares the manager's clock.",
        metrics.lateness,
    )
    _workers(out, metrics.stats)
    _schedules(out, metrics.schedules)
    _manager(out, metrics)
    if metrics.process is not None:
        _process(out, metrics.process)
    return out.text()


def _jobs(out: _Exposition, stats: Stats) -> None:
    q = stats.queue
    out.family(
        "mpsched_jobs_pending",
        "gauge",
        "Jobs waiting in the heap, by priority.",
        [("", {"priority": p}, q.pending.get(p.lower(), 0)) for p in PRIORITIES],
    )
    out.family(
        "mpsched_queue_pending",
        "gauge",
        "Jobs pending in each named queue.",
        [("", {"queue": s.name}, s.pending) for s in stats.queues],
    )
    out.family(
        "mpsched_queue_workers",
        "gauge",
        "Workers that serve each named queue.",
        [("", {"queue": s.name}, s.workers) for s in stats.queues],
    )
    out.family(
        "mpsched_jobs_running",
        "gauge",
        "Jobs handed to a worker and not yet ended.",
        [("", {}, q.in_flight)],
    )
    out.family(
        "mpsched_jobs_submitted_total", "counter", "Jobs submitted.", [("", {}, q.submitted)]
    )
    ended = {
        "done": q.completed,
        "failed": q.failed - q.crashed - q.timed_out,
        "cancelled": q.cancelled,
        "crashed": q.crashed,
        "timeout": q.timed_out,
    }
    out.family(
        "mpsched_jobs_finished_total",
        "counter",
        "Jobs that ended, by outcome: done, failed (the job raised), cancelled, "
        "crashed (lost with its worker, not run again), timeout (killed).",
        [("", {"outcome": o}, ended[o]) for o in OUTCOMES],
    )
    retried = {"crash": q.retried, "exception": q.retried_exception, "retry_later": q.retried_later}
    out.family(
        "mpsched_jobs_retried_total",
        "counter",
        "Attempts run again, by cause: crash (the worker died under it), exception "
        "(its retry policy), retry_later (it raised RetryLater).",
        [("", {"cause": cause}, count) for cause, count in retried.items()],
    )
    if q.next_due_in is not None:
        out.family(
            "mpsched_jobs_next_due_seconds",
            "gauge",
            "Seconds until the earliest pending job is due (negative: overdue).",
            [("", {}, q.next_due_in)],
        )


def _workers(out: _Exposition, stats: Stats) -> None:
    states: dict[tuple[str, str], int] = {}
    for w in stats.workers:
        states.setdefault((w.host, "busy"), 0)
        states.setdefault((w.host, "idle"), 0)
        states[w.host, "busy" if w.current_job else "idle"] += 1
    out.family(
        "mpsched_workers",
        "gauge",
        "Connected workers, by state (busy, idle) and host.",
        [("", {"state": state, "host": host}, n) for (host, state), n in sorted(states.items())],
    )
    out.family(
        "mpsched_workers_missing",
        "gauge",
        "Local workers the manager wants but could not start yet.",
        [("", {}, stats.workers_missing)],
    )
    # By host and slot, never by worker id or pid: a worker that replaces another takes its
    # slot, and its series goes on (a counter that restarts, as a restarted process's
    # does), so recycled workers add no series.
    each = [({"host": w.host, "slot": str(w.slot)}, w) for w in stats.workers]
    out.family(
        "mpsched_worker_rss_bytes",
        "gauge",
        "Resident memory of each worker process, by host and slot.",
        [("", labels, w.rss) for labels, w in each],
    )
    out.family(
        "mpsched_worker_cpu_seconds_total",
        "counter",
        "User and system CPU time of each worker process, by host and slot (from 0 "
        "again when a new process takes the slot).",
        [("", labels, w.cpu_seconds) for labels, w in each],
    )
    out.family(
        "mpsched_worker_jobs_total",
        "counter",
        "Jobs each worker process has reported, by host and slot (from 0 again when "
        "a new process takes the slot).",
        [("", labels, w.jobs_done) for labels, w in each],
    )


def _schedules(out: _Exposition, schedules: Sequence[ScheduleInfo]) -> None:
    for field, text in (
        ("runs", "Runs of each schedule that started."),
        (
            "skipped",
            "Slots of each schedule passed over because its previous run was pending or running.",
        ),
        ("missed", "Slots of each schedule not run after downtime or a backlog."),
        ("failed", "Runs of each schedule that ended with an error."),
    ):
        out.family(
            f"mpsched_schedule_{field}_total",
            "counter",
            text,
            [("", {"schedule": s.schedule_id}, getattr(s.counters, field)) for s in schedules],
        )
    out.family(
        "mpsched_schedule_paused",
        "gauge",
        "1 while a schedule is paused.",
        [("", {"schedule": s.schedule_id}, int(s.paused)) for s in schedules],
    )
    out.family(
        "mpsched_schedule_next_run_timestamp_seconds",
        "gauge",
        "When each schedule's next run is planned, Unix epoch seconds.",
        [
            ("", {"schedule": s.schedule_id}, s.next_run.timestamp())
            for s in schedules
            if s.next_run is not None
        ],
    )


def _manager(out: _Exposition, metrics: MetricsInput) -> None:
    stats = metrics.stats
    out.family(
        "mpsched_clients", "gauge", "Clients connected to the manager.", [("", {}, stats.clients)]
    )
    out.family(
        "mpsched_start_time_seconds",
        "gauge",
        "When the manager started, Unix epoch seconds.",
        [("", {}, metrics.started_wall)],
    )
    if metrics.build is not None:
        out.family(
            "mpsched_build_info",
            "gauge",
            "Always 1; its labels say which mpsched and Python the manager runs.",
            [("", metrics.build, 1)],
        )
    if stats.store != "memory" and stats.store_size is not None:
        out.family(
            "mpsched_store_size_bytes",
            "gauge",
            "Bytes the Redis server of the job store uses (INFO used_memory: every "
            "key on it, other deployments' too)."
            if is_redis_url(stats.store)
            else "Bytes the job store takes (database, journal, lease log).",
            [("", {}, stats.store_size)],
        )
    if stats.store_jobs is not None:
        out.family(
            "mpsched_store_jobs",
            "gauge",
            "Job records the store keeps: pending, running, and ended ones until "
            "result_ttl (each ~0.75 KB in Redis, plus its payload or outcome).",
            [("", {}, stats.store_jobs)],
        )
    if metrics.commit_latency is not None:
        out.histogram(
            "mpsched_store_commit_seconds",
            "Seconds each store transaction took to write and commit.",
            metrics.commit_latency,
        )


def _process(out: _Exposition, process: ProcessFigures) -> None:
    """The standard process metrics, of the manager process (workers have their own)."""
    for name, kind, text, value in (
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time of the manager process, in seconds.",
            process.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of the manager process, in bytes.",
            process.rss,
        ),
        (
            "process_open_fds",
            "gauge",
            "File descriptors the manager process has open.",
            process.open_fds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "When the manager process started, Unix epoch seconds.",
            process.start_time,
        ),
    ):
        out.family(name, kind, text, [("", {}, value)])


class _Exposition:
    """Lines of the text format, family by family."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, text: str, samples: Iterable[Sample]) -> None:
        """One metric family; each sample's name is ``name`` plus its suffix."""
        self._lines.append(f"# HELP {name} {_escape_help(text)}")
        self._lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            self._lines.append(f"{name}{suffix}{_labels(labels)} {_value(value)}")

    def histogram(self, name: str, text: str, snapshot: HistogramSnapshot) -> None:
        bounds = [_value(b) for b in snapshot.bounds] + ["+Inf"]
        samples: list[Sample] = [
            ("_bucket", {"le": le}, n) for le, n in zip(bounds, snapshot.cumulative(), strict=True)
        ]
        samples += [("_sum", {}, snapshot.total), ("_count", {}, snapshot.observations)]
        self.family(name, "histogram", text, samples)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
