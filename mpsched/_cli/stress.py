"""The stress run: producer processes flood one manager; every job must run once, none early.

``run_stress`` starts a Scheduler (or uses a running manager), then ``producers`` spawned
processes that connect to it and together submit ``jobs`` jobs with random due times in
``[0, horizon]`` and random priorities. Each job appends its key to one O_APPEND log (a
single ``write``, so lines from concurrent workers never interleave) and returns its start
time on ``time.monotonic()``, which is system-wide on Linux and so comparable with the
producer's own clock. The log is then the ground truth of what ran::

    run_stress ──spawn──▶ producer 0..n-1 ──schedule(record, key, delay)──▶ manager
        ▲                     │  ▲                                            │
        │ ProducerReport      │  └──── futures: start times ◀── workers ◀────┘
        └─────────────────────┘                                   │
                             stress.log ◀── one "key\\n" per run ──┘

Verified: no key missing from the log, none in it twice, none unknown; no job started
before the earliest due time its producer computed before submitting it; every future
resolved with a result.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, TextIO

from mpsched._cli.stress_options import Injection
from mpsched._cli.stress_producers import run_producers
from mpsched._cli.stress_report import StressReport, collect, print_report, verify
from mpsched._client.scheduler import Scheduler
from mpsched._transport.tls import TlsConfig


def run_stress(
    *,
    producers: int,
    workers: int,
    jobs: int,
    horizon: float = 2.0,
    address: Any = None,
    authkey: bytes | None = None,
    tls: TlsConfig | None = None,
    inject: str | None = None,
    out: TextIO,
) -> int:
    """Flood a manager from ``producers`` processes; check every job ran once, none early.

    Args:
        producers: producer processes (spawned); they share the ``jobs`` between them.
        workers: worker processes of the Scheduler started here; ignored with ``address``.
        jobs: how many jobs in all, each due at a random time in ``[0, horizon]`` seconds
            after its submission, at a random priority.
        address, authkey: a running manager to use instead of starting a Scheduler.
        tls: how the producers connect to ``address`` over TCP (None: without TLS).
        inject: ``"duplicate"`` or ``"loss"`` plants that fault in the run log before it is
            verified. For testing the verifier only: the run then must FAIL.
        out: where the report goes.

    Returns:
        0 when every check passed, 1 otherwise (the last line printed says which).

    Raises:
        ValueError: a bad count, horizon or ``inject``, or ``address`` without ``authkey``.
    """
    _validate(producers, workers, jobs, horizon, address, authkey, inject)
    begun = time.monotonic()
    report = StressReport(
        jobs=jobs, producers=producers, workers=None if address is not None else workers
    )
    with tempfile.TemporaryDirectory(prefix="mpsched-stress-") as tmp:
        log_path = os.path.join(tmp, "stress.log")
        if address is None:
            _run_own(report, horizon, log_path)
        else:
            assert authkey is not None
            collect(report, run_producers(report, address, authkey, log_path, horizon, tls))
        if inject is not None:
            _inject(log_path, Injection.coerce(inject, "inject"))
        verify(report, log_path)
    report.elapsed = time.monotonic() - begun
    print_report(report, out)
    return 0 if report.ok else 1


def _validate(
    producers: int,
    workers: int,
    jobs: int,
    horizon: float,
    address: Any,
    authkey: bytes | None,
    inject: str | None,
) -> None:
    for name, value in (("producers", producers), ("workers", workers), ("jobs", jobs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    if not 0.0 <= horizon < float("inf"):
        raise ValueError(f"horizon must be a finite number of seconds >= 0, not {horizon!r}")
    if address is not None and authkey is None:
        raise ValueError("connecting to a running manager needs its authkey")
    if inject is not None:
        Injection.coerce(inject, "inject")  # ConfigError, a ValueError


def _run_own(report: StressReport, horizon: float, log_path: str) -> None:
    """Run the producers against a Scheduler of our own, always shut down afterwards."""
    assert report.workers is not None
    with Scheduler(workers=report.workers) as s:  # __exit__ shuts it down, even on error
        reports = run_producers(report, s.address, s.authkey, log_path, horizon)
        stats = s.stats().queue
    report.manager_lateness = stats.lateness
    report.manager_samples = stats.lateness_samples
    collect(report, reports)


def _inject(log_path: str, inject: Injection) -> None:
    """Plant a fault in the run log: repeat or drop its first key."""
    with open(log_path) as log:
        lines = log.readlines()
    if not lines:  # nothing ran: the run fails anyway
        return
    if inject is Injection.DUPLICATE:
        lines.append(lines[0])
    else:
        del lines[0]
    with open(log_path, "w") as log:
        log.writelines(lines)
