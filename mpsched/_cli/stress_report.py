"""What a stress run found: the producers' replies, the checks of the run log against the
keys submitted, and the report printed at the end (see :mod:`mpsched._cli.stress`)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from mpsched._cli.formats import plural
from mpsched._core.leases import percentiles


@dataclass(frozen=True)
class ProducerReport:
    """What a producer sends back: its keys, early starts and its own lateness samples."""

    producer: int
    returned: tuple[str, ...]  # keys whose futures resolved with a start time
    early: int  # jobs that started before the earliest due time computed for them
    lateness: tuple[float, ...]  # start - earliest due, seconds, per returned job
    first_submit: float  # time.monotonic()
    last_done: float  # time.monotonic() once every future was resolved (or given up)
    crashed: tuple[str, ...] = ()  # keys that failed as WorkerCrashedError (a killed manager)


@dataclass(frozen=True)
class ProducerFailed:
    """Sent instead of a report when a producer raised."""

    producer: int
    reason: str


@dataclass
class StressReport:
    """The outcome of one stress run, as printed by :func:`run_stress`."""

    jobs: int
    producers: int
    workers: int | None  # None: the workers of a manager we only connected to
    elapsed: float = 0.0  # seconds, whole run
    busy: float = 0.0  # seconds from the first submit to the last future resolved
    manager_lateness: dict[str, float] | None = None
    manager_samples: int = 0
    producer_lateness: dict[str, float] = field(default_factory=dict)
    lost: int = 0  # expected keys missing from the log
    duplicated: int = 0  # keys in the log more than once
    unknown: int = 0  # keys in the log nobody submitted
    early: int = 0
    unresolved: int = 0  # expected keys whose futures never returned a start time
    crashed: int = 0  # keys whose manager was killed as they ran: at most one run each
    errors: list[str] = field(default_factory=list)  # producers that failed outright

    def problems(self) -> list[str]:
        """Each failed check as a phrase; empty when the run passed."""
        found = [
            f"{n} {what}"
            for n, what in (
                (self.lost, "lost (never ran)"),
                (self.duplicated, "duplicated (ran more than once)"),
                (self.unknown, "unknown (ran but never submitted)"),
                (self.early, "early (started before due)"),
                (self.unresolved, "unresolved (future without a result)"),
            )
            if n
        ]
        return found + self.errors

    @property
    def ok(self) -> bool:
        return not self.problems()


def job_keys(producer: int, count: int) -> list[str]:
    """The keys producer ``producer`` submits; the verifier expects exactly these."""
    return [f"p{producer}-{i}" for i in range(count)]


def shares(jobs: int, producers: int) -> list[int]:
    """``jobs`` shared as evenly as possible; the first producers take one more."""
    share, extra = divmod(jobs, producers)
    return [share + (p < extra) for p in range(producers)]


def _expected_keys(report: StressReport) -> set[str]:
    counts = shares(report.jobs, report.producers)
    return {k for p, n in enumerate(counts) for k in job_keys(p, n)}


def collect(report: StressReport, replies: list[ProducerReport | ProducerFailed]) -> None:
    """Fold the producers' replies into ``report``: early starts, lateness, throughput."""
    reports = [r for r in replies if isinstance(r, ProducerReport)]
    report.errors += [
        f"producer {r.producer} failed: {r.reason}"
        for r in replies
        if isinstance(r, ProducerFailed)
    ]
    report.early = sum(r.early for r in reports)
    report.producer_lateness = percentiles([x for r in reports for x in r.lateness])
    if reports:
        report.busy = max(r.last_done for r in reports) - min(r.first_submit for r in reports)
    returned = {k for r in reports for k in r.returned}
    report.crashed = len({k for r in reports for k in r.crashed})
    report.unresolved = len(_expected_keys(report) - returned) - report.crashed


def verify(report: StressReport, log_path: str, crashed: set[str] | None = None) -> None:
    """Compare the run log with the keys submitted: lost, duplicated and unknown keys
    (a key in ``crashed`` may have run once, or not at all)."""
    expected = _expected_keys(report) - (crashed or set())
    runs: Counter[str] = Counter()
    if os.path.exists(log_path):
        with open(log_path) as log:
            runs.update(line.rstrip("\n") for line in log)
    report.lost = len(expected - runs.keys())
    report.duplicated = sum(1 for n in runs.values() if n > 1)
    report.unknown = len(runs.keys() - expected - (crashed or set()))


def print_report(report: StressReport, out: TextIO) -> None:
    workers = "those of the running manager" if report.workers is None else report.workers
    throughput = report.jobs / report.busy if report.busy > 0 else 0.0
    print(f"jobs:        {report.jobs}", file=out)
    print(f"producers:   {plural(report.producers, 'process')}", file=out)
    print(f"workers:     {workers}", file=out)
    print(f"elapsed:     {report.elapsed:.2f} s", file=out)
    print(
        f"throughput:  {throughput:.0f} jobs/s (first submit to last result, {report.busy:.2f} s)",
        file=out,
    )
    if report.crashed:
        print(
            f"crashed:     {report.crashed} (their manager was killed as they ran: "
            f"WorkerCrashedError, run at most once)",
            file=out,
        )
    if report.manager_lateness is not None:
        samples = plural(report.manager_samples, "job")
        print(
            f"lateness, manager (due -> start, last {samples}): {_ms(report.manager_lateness)}",
            file=out,
        )
    print(
        f"lateness, producers (submit call + delay -> start): {_ms(report.producer_lateness)}",
        file=out,
    )
    # The manager computes a job's due time when the job arrives; a producer, before its
    # submit call. Between the two the job waits in the producer's write-behind outbox.
    print(
        "  producers count from their submit call, so their figure adds each job's trip "
        "to the manager\n  (batched behind the one in flight while they flood it); the "
        "manager counts from its arrival",
        file=out,
    )
    problems = report.problems()
    if problems:
        print(f"FAIL: {'; '.join(problems)}", file=out)
    else:
        print(f"OK: {report.jobs} jobs ran exactly once, none early", file=out)


def _ms(lateness: dict[str, float]) -> str:
    return "  ".join(
        f"{name} {lateness.get(name, 0.0) * 1000:.1f} ms" for name in ("p50", "p90", "p99", "max")
    )
