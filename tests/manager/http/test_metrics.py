"""The Prometheus text, rendered from counters a test sets, read back by prometheus_client's
own parser."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mpsched._core.histogram import COMMIT_BOUNDS, LATENESS_BOUNDS, Histogram, empty
from mpsched._core.job import QueueStats
from mpsched._core.recurring import ScheduleCounters, ScheduleInfo
from mpsched._manager.http.metrics import MetricsInput, ProcessFigures, render
from mpsched._protocol.records import Stats, WorkerStatus

NEXT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def queue_stats(**changes: Any) -> QueueStats:
    values: dict[str, Any] = dict(
        pending={"high": 3, "medium": 0, "low": 7},
        in_flight=2,
        submitted=40,
        completed=20,
        failed=6,
        cancelled=4,
        retried=1,
        timed_out=2,
        started_early=0,
        next_due_in=-0.5,
        lateness={"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0},
        lateness_samples=0,
        wakeups=0,
        waiting=0,
        crashed=1,
    )
    values.update(changes)
    return QueueStats(**values)


def stats(**changes: Any) -> Stats:
    workers = (
        WorkerStatus(
            worker_id="w1",
            pid=101,
            host="alpha",
            remote=False,
            jobs_done=12,
            current_job="job-9",
            cpu_percent=50.0,
            rss=2**20,
            cpu_seconds=1.5,
            slot=0,
        ),
        WorkerStatus(
            worker_id="w2",
            pid=102,
            host="alpha",
            remote=False,
            jobs_done=8,
            current_job=None,
            cpu_percent=0.0,
            rss=2**21,
            cpu_seconds=0.25,
            slot=1,
        ),
        WorkerStatus(
            worker_id='b"e\\ta:7.0',
            pid=7,
            host='be"ta\n',
            remote=True,
            jobs_done=3,
            current_job=None,
            cpu_percent=1.0,
            rss=2**22,
            cpu_seconds=9.0,
            slot=0,
        ),
    )
    values: dict[str, Any] = dict(
        queue=queue_stats(), workers=workers, uptime=5.0, throughput=1.0, clients=2
    )
    values.update(changes)
    return Stats(**values)


def schedule(
    schedule_id: str, runs: int, skipped: int, missed: int, failed: int, paused: bool = False
) -> ScheduleInfo:
    return ScheduleInfo(
        schedule_id,
        "every 10 s",
        "jobs:tick",
        None if paused else NEXT,
        paused,
        False,
        ScheduleCounters(runs, skipped, missed, failed),
        None,
        "",
    )


def parsed(text: str) -> dict[str, Any]:
    """Family name -> family, as Prometheus' client library reads the text."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    found = [
        s.value
        for s in families[family].samples
        if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, labels, found)
    return float(found[0])


def lateness() -> Any:
    histogram = Histogram(LATENESS_BOUNDS)
    for seconds in (0.00005, 0.0003, 0.0003, 0.002, 75.0):
        histogram.observe(seconds)
    return histogram.snapshot()


def test_job_counts_by_priority_and_outcome() -> None:
    families = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    assert families["mpsched_jobs_pending"].type == "gauge"
    assert [
        value(families, "mpsched_jobs_pending", priority=p) for p in ("HIGH", "MEDIUM", "LOW")
    ] == [3, 0, 7]
    assert value(families, "mpsched_jobs_running") == 2
    finished = families["mpsched_jobs_finished"]
    assert finished.type == "counter"
    assert {s.labels["outcome"]: s.value for s in finished.samples} == {
        "done": 20,
        "failed": 3,
        "cancelled": 4,
        "crashed": 1,
        "timeout": 2,
    }
    assert value(families, "mpsched_jobs_retried", "mpsched_jobs_retried_total", cause="crash") == 1
    assert value(families, "mpsched_jobs_submitted", "mpsched_jobs_submitted_total") == 40
    assert value(families, "mpsched_jobs_next_due_seconds") == -0.5


def test_retried_attempts_are_counted_by_cause() -> None:
    queue = queue_stats(retried=2, retried_exception=5, retried_later=3)
    families = parsed(render(MetricsInput(stats(queue=queue), lateness(), [], None, 1.7e9)))
    retried = families["mpsched_jobs_retried"]
    assert retried.type == "counter"
    assert {s.labels["cause"]: s.value for s in retried.samples} == {
        "crash": 2,
        "exception": 5,
        "retry_later": 3,
    }


def test_lateness_is_a_histogram_in_seconds() -> None:
    families = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    family = families["mpsched_lateness_seconds"]
    assert family.type == "histogram"
    buckets = {
        s.labels["le"]: s.value
        for s in family.samples
        if s.name == "mpsched_lateness_seconds_bucket"
    }
    assert (
        buckets["0.0001"],
        buckets["0.0005"],
        buckets["0.0025"],
        buckets["60.0"],
        buckets["+Inf"],
    ) == (1, 3, 4, 4, 5)
    assert value(families, "mpsched_lateness_seconds", "mpsched_lateness_seconds_count") == 5
    assert value(families, "mpsched_lateness_seconds", "mpsched_lateness_seconds_sum") == sum(
        (0.00005, 0.0003, 0.0003, 0.002, 75.0)
    )


def test_workers_by_state_and_host_and_each_ones_memory_and_cpu() -> None:
    families = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    assert value(families, "mpsched_workers", state="busy", host="alpha") == 1
    assert value(families, "mpsched_workers", state="idle", host="alpha") == 1
    assert value(families, "mpsched_workers", state="busy", host='be"ta\n') == 0
    assert value(families, "mpsched_worker_rss_bytes", host="alpha", slot="1") == 2**21
    cpu = families["mpsched_worker_cpu_seconds"]
    assert cpu.type == "counter"
    assert (
        value(
            families,
            "mpsched_worker_cpu_seconds",
            "mpsched_worker_cpu_seconds_total",
            host='be"ta\n',
            slot="0",
        )
        == 9.0
    )
    assert (
        value(families, "mpsched_worker_jobs", "mpsched_worker_jobs_total", host="alpha", slot="0")
        == 12
    )


def test_a_workers_series_are_by_host_and_slot_never_by_its_id_or_pid() -> None:
    """A recycled worker's replacement takes its slot: the series go on, none is added."""
    families = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    for family in ("mpsched_worker_rss_bytes", "mpsched_worker_cpu_seconds", "mpsched_worker_jobs"):
        assert {frozenset(s.labels.items()) for s in families[family].samples} == {
            frozenset({("host", "alpha"), ("slot", "0")}),
            frozenset({("host", "alpha"), ("slot", "1")}),
            frozenset({("host", 'be"ta\n'), ("slot", "0")}),
        }, family


def test_schedule_counters_by_schedule_id() -> None:
    schedules = [schedule("nightly", 5, 2, 1, 0), schedule("cache", 9, 0, 0, 3, paused=True)]
    families = parsed(render(MetricsInput(stats(), lateness(), schedules, None, 1.7e9)))
    for field, expected in (
        ("runs", (5, 9)),
        ("skipped", (2, 0)),
        ("missed", (1, 0)),
        ("failed", (0, 3)),
    ):
        got = tuple(
            value(
                families, f"mpsched_schedule_{field}", f"mpsched_schedule_{field}_total", schedule=s
            )
            for s in ("nightly", "cache")
        )
        assert got == expected, field
    assert value(families, "mpsched_schedule_paused", schedule="cache") == 1
    assert (
        value(families, "mpsched_schedule_next_run_timestamp_seconds", schedule="nightly")
        == NEXT.timestamp()
    )
    assert not [
        s
        for s in families["mpsched_schedule_next_run_timestamp_seconds"].samples
        if s.labels["schedule"] == "cache"
    ]


def test_store_metrics_only_where_a_store_is_configured() -> None:
    without = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    assert not [name for name in without if name.startswith("mpsched_store_")]
    commits = Histogram(COMMIT_BOUNDS)
    commits.observe(0.004)
    commits.observe(0.3)
    with_store = parsed(
        render(
            MetricsInput(
                stats(store="/var/lib/jobs.db", store_size=123_456),
                lateness(),
                [],
                commits.snapshot(),
                1.7e9,
            )
        )
    )
    assert value(with_store, "mpsched_store_size_bytes") == 123_456
    assert with_store["mpsched_store_commit_seconds"].type == "histogram"
    assert (
        value(with_store, "mpsched_store_commit_seconds", "mpsched_store_commit_seconds_count") == 2
    )
    untimed = parsed(
        render(
            MetricsInput(  # a store that does not time its commits
                stats(store="redis://localhost/0", store_size=99), lateness(), [], None, 1.7e9
            )
        )
    )
    assert value(untimed, "mpsched_store_size_bytes") == 99
    assert "mpsched_store_commit_seconds" not in untimed


def test_the_manager_process_in_the_standard_process_metrics_and_its_build() -> None:
    families = parsed(
        render(
            MetricsInput(
                stats(),
                lateness(),
                [],
                None,
                1.7e9,
                process=ProcessFigures(
                    cpu_seconds=12.5, rss=3 * 2**20, open_fds=17, start_time=1.6e9
                ),
                build={"version": "0.1.0", "python": "3.11.7"},
            )
        )
    )
    assert families["process_cpu_seconds"].type == "counter"
    assert value(families, "process_cpu_seconds", "process_cpu_seconds_total") == 12.5
    assert value(families, "process_resident_memory_bytes") == 3 * 2**20
    assert value(families, "process_open_fds") == 17
    assert value(families, "process_start_time_seconds") == 1.6e9
    assert value(families, "mpsched_build_info", version="0.1.0", python="3.11.7") == 1
    unread = parsed(render(MetricsInput(stats(), lateness(), [], None, 1.7e9)))
    assert not [name for name in unread if name.startswith("process_")]


def test_names_follow_prometheus_conventions() -> None:
    text = render(
        MetricsInput(
            stats(store="x", store_size=1),
            empty(LATENESS_BOUNDS),
            [schedule("s", 0, 0, 0, 0)],
            empty(COMMIT_BOUNDS),
            1.7e9,
            process=ProcessFigures(cpu_seconds=1.0, rss=1, open_fds=1, start_time=1.0),
            build={"version": "1", "python": "3"},
        )
    )
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert len(types) == len(re.findall(r"^# HELP ", text, re.MULTILINE)) >= 25
    for name, kind in types.items():
        assert re.fullmatch(r"(mpsched|process)_[a-z_]+", name), name
        assert name.endswith("_total") == (kind == "counter"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
    assert value(parsed(text), "mpsched_start_time_seconds") == 1.7e9


def test_a_redis_store_says_what_its_size_covers_and_how_many_jobs_it_keeps() -> None:
    families = parsed(
        render(
            MetricsInput(
                stats(store="redis://localhost/0", store_size=99, store_jobs=7),
                lateness(),
                [],
                None,
                1.7e9,
            )
        )
    )
    assert "other deployments" in families["mpsched_store_size_bytes"].documentation
    assert value(families, "mpsched_store_jobs") == 7
