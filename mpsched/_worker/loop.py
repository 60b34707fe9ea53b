"""The worker loop: take due jobs, run them, report, repeat.

A worker runs each job in its own process, outside any manager lock (mpsched._worker.run).
Its reports ride on its next ``take`` call, so one round trip both completes the jobs it
ran and asks for more. A local worker whose last job was short asks for several due jobs
at once (mpsched._core.prefetch): it claims each beyond the first in its claim slot
(mpsched._worker.claims) before it starts it, and a reporter thread sends the reports of
the first ones if the batch goes on (mpsched._worker.reports).

Local workers are started by the manager's supervisor; they share the manager's monotonic
clock, so they may be handed a job early and wait for its due time themselves. Remote
workers (mpsched._worker.remote) acknowledge each lease with a call, take one job at a
time, and never read the manager's clock: they get jobs when due.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection

import psutil

from mpsched._core.job import Assignment, Lease
from mpsched._core.prefetch import BATCH_TIME, PREFETCH
from mpsched._errors import SchedulerShutdownError, WorkerDismissedError
from mpsched._protocol.codec import report_to_wire
from mpsched._protocol.proxy import ServiceProxy, connect_service
from mpsched._protocol.records import LONG_POLL, Report
from mpsched._worker import context
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.process import (
    Draining,
    DrainState,
    JobTimeouts,
    WorkerConfig,
    make_hello,
    setup_process,
)
from mpsched._worker.reports import Reports
from mpsched._worker.run import result_segment, run, start_time
from mpsched._worker.stop_reasons import LoopEnd

log = logging.getLogger("mpsched.worker")


def worker_main(
    config: WorkerConfig, slot: ClaimSlot | None = None, lifeline: Connection | None = None
) -> None:
    """Entry point of a local worker process: join the manager, serve until it stops.

    Args:
        slot: shared with the manager: the worker records in it each lease it receives or
            starts, so the manager can tell a job that never arrived (requeued untouched)
            from one that started, and claims its prefetched jobs there (None: no prefetch).
        lifeline: the read end of a pipe only the manager writes to; when it closes the
            manager is gone and this worker exits at once, even in the middle of a job.
    """
    setup_process(config, lifeline)
    service = connect_service(config.address, config.authkey)
    service.hello(
        make_hello(
            config.worker_id, remote=False, local_token=config.local_token, queues=config.queues
        )
    )
    if slot is None:
        serve(service, config, lambda lease: None)
    else:
        serve(service, config, slot.received, slot=slot)


def serve(
    service: ServiceProxy,
    config: WorkerConfig,
    received: Callable[[Lease], None],
    drain: DrainState | None = None,
    long_poll: float = LONG_POLL,
    timeouts: JobTimeouts | None = None,
    slot: ClaimSlot | None = None,
) -> LoopEnd:
    """Take, run and report jobs until the manager stops (STOPPED), goes away (LOST) or
    dismisses this remote worker (DISMISSED: it left, its pool leaves), the worker drains
    (DRAINED), or it is time to recycle this process (RECYCLED: ``max_tasks`` /
    ``max_memory``).

    Reports ride on the next take. A remote worker's take that carries some returns at
    once (a job that is due, or none), and only then does it wait ``long_poll``: when the
    manager goes away, the worker knows whether it had answered for the last reports.

    Args:
        received: acknowledges the first job of each batch as it arrives; an OSError or
            EOFError from it means the manager is gone (LOST), and the job is not run.
        drain: a remote worker's drain flag (None: a local worker, stopped by its manager).
        timeouts: enforces each job's timeout in this process (None: the manager does).
        slot: the worker's ClaimSlot. With it, a local worker whose last job was short
            asks for prefetched jobs too (mpsched._core.prefetch), starts each only if it
            claims it there, and keeps there the reports it holds back meanwhile. A remote
            worker's slot (its pool's), and a durable one, also record which job the
            worker enters and keep every report until the manager has it. None: one job
            per take, nothing recorded.
    """
    worker_id = config.worker_id
    reports = Reports(partial(service.report, worker_id))
    _bind_context(service, worker_id)
    state = _Batches(config, slot, service, remote=drain is not None)
    unsent: list[Report] = []
    try:
        while drain is None or not drain.draining:
            unsent = reports.take_all()
            # A remote worker's take that hands in reports does not wait: its answer says
            # they arrived, so an idle worker holds no report its manager may not have.
            wait = 0.0 if unsent and drain is not None else long_poll
            try:
                batch = _take(service, worker_id, unsent, wait, drain, state.more())
            except Draining:
                break
            except (SchedulerShutdownError, EOFError, OSError) as exc:
                return _take_failed(exc, config, reports, unsent, drain is not None)
            unsent = []
            state.delivered(reports)
            end = state.run_batch(batch, received, reports, timeouts)
            if end is not None:
                if end == LoopEnd.RECYCLED:
                    log.info("worker %s recycles after %d job(s)", worker_id, state.done)
                    _leave(config, worker_id, _closed(reports), drain is not None)
                return end
    finally:
        reports.close()
    unsent += _closed(reports)
    _leave(config, worker_id, unsent, drain is not None)
    return LoopEnd.DRAINED


def _bind_context(service: ServiceProxy, worker_id: str) -> None:
    """Send its jobs' progress and their questions to the manager through this join's proxy."""
    context.bind(
        lambda updates: service.progress(worker_id, updates),
        lambda job_id: service.retry_budget(job_id),
    )


def _take_failed(
    exc: BaseException, config: WorkerConfig, reports: Reports, unsent: list[Report], remote: bool
) -> LoopEnd:
    """How the loop ends when a take raised ``exc``: dismissed (it leaves), stopped, or lost."""
    if isinstance(exc, WorkerDismissedError):  # the take's own reports went in before it
        _leave(config, config.worker_id, _closed(reports), remote)
        return LoopEnd.DISMISSED
    if isinstance(exc, SchedulerShutdownError):
        return LoopEnd.STOPPED
    _log_lost(config.worker_id, exc, _unanswered(unsent))
    return LoopEnd.LOST


def _closed(reports: Reports) -> list[Report]:
    """Stop the reporter (after its send under way) and return what it did not send."""
    reports.close()
    return reports.take_all()


def _unanswered(reports: list[Report]) -> str:
    if len(reports) == 1:
        return (
            f"; the report of job {reports[0].outcome.job_id} got no answer: its "
            f"outcome is lost unless the manager recorded it"
        )
    if reports:
        return (
            f"; the reports of jobs {', '.join(r.outcome.job_id for r in reports)} got "
            f"no answer: their outcomes are lost unless the manager recorded them"
        )
    return ""


class _Batches:
    """How many jobs a worker asks for at once, and running what it gets."""

    def __init__(
        self, config: WorkerConfig, slot: ClaimSlot | None, service: ServiceProxy, *, remote: bool
    ) -> None:
        self._config = config
        self._slot = slot
        self._service = service
        self._prefetch = slot is not None and not remote  # remote workers take one job
        # Whoever reads the slot after this worker (or its manager) is gone learns which
        # job it entered and what it ran (mpsched._worker.claims): a durable slot, and a
        # remote worker's, which its pool reads (or it itself, joining again).
        self._traced = slot is not None and (slot.durable or remote)
        self._entering = slot.entering if slot is not None and self._traced else None
        self._last_run = float("inf")  # seconds the last job ran: long until one did
        self.done = 0

    def more(self) -> int:
        """Prefetched jobs to ask for: as many as the last job's run time says fit in
        BATCH_TIME (none after a job that ran that long), within max_tasks."""
        if not self._prefetch or self._last_run >= BATCH_TIME:
            return 0
        more = PREFETCH - 1
        if self._last_run > 0:
            more = min(more, int(BATCH_TIME / self._last_run) - 1)
        if self._config.max_tasks is not None:
            more = min(more, self._config.max_tasks - self.done - 1)
        return max(more, 0)

    def run_batch(
        self,
        batch: list[Assignment],
        received: Callable[[Lease], None],
        reports: Reports,
        timeouts: JobTimeouts | None,
    ) -> LoopEnd | None:
        """Run the jobs of one take in order; returns None to take again, LOST (the
        manager is gone) or RECYCLED (time to leave)."""
        for i, assignment in enumerate(batch):
            lease = assignment.lease
            if self._slot is not None and not self._slot.may_start(lease.lease_id):
                break  # its manager's lease was taken back: it and the rest went elsewhere
            if i and not self._claim_or_stop(lease):
                break  # revoked: it and the rest of the batch went to other workers
            if not i:
                try:
                    received(lease)
                except (EOFError, OSError) as exc:
                    # Unacknowledged, the job counts as never delivered and may run elsewhere.
                    _log_lost(self._config.worker_id, exc, f"; job {lease.job_id} is not run here")
                    return LoopEnd.LOST
            report = self._run_one(assignment, timeouts)
            held = i + 1 < len(batch)
            # A traced slot keeps every report until the manager has it; any slot keeps
            # those held back while the batch goes on.
            kept = (held or self._traced) and self._keep(report)
            if _should_recycle(self._config, self.done):
                reports.add(report)
                return LoopEnd.RECYCLED
            if not held:
                reports.add(report)
            elif kept:
                reports.hold(report)
            else:  # no room in the slot: every report goes now, this job's included
                reports.add(report)
                self._service.report(self._config.worker_id, reports.take_all())
                self.delivered(reports)
        return None

    def delivered(self, reports: Reports) -> None:
        """A take returned: the manager has every report made before it (once a send of
        the reporter's under way has ended), so the kept ones may go."""
        if self._slot is not None:
            reports.settle()
            self._slot.forget_kept()

    def _keep(self, report: Report) -> bool:
        """Keep ``report`` in the slot until the manager has it; False if it has no room."""
        assert self._slot is not None  # a batch of more than one job needs it
        return self._slot.keep(pickle.dumps(report_to_wire(report), pickle.HIGHEST_PROTOCOL))

    def _claim_or_stop(self, lease: Lease) -> bool:
        assert self._slot is not None  # a batch of more than one job needs it
        return self._slot.claim(lease)

    def _run_one(self, assignment: Assignment, timeouts: JobTimeouts | None) -> Report:
        start_at = start_time(assignment)
        segment = result_segment(self._config, assignment)
        with timeouts.guard(assignment.timeout) if timeouts else contextlib.nullcontext():
            outcome = run(assignment, start_at, segment, self._entering)
        ended = time.monotonic()
        self._last_run = ended - (start_at if outcome.started is None else outcome.started)
        self.done += 1
        return Report(lease_id=assignment.lease.lease_id, outcome=outcome)


def _log_lost(worker_id: str, exc: BaseException, consequence: str) -> None:
    log.warning(
        "worker %s lost its manager (%s: %s)%s", worker_id, type(exc).__name__, exc, consequence
    )


def _take(
    service: ServiceProxy,
    worker_id: str,
    reports: list[Report],
    long_poll: float,
    drain: DrainState | None,
    more: int,
) -> list[Assignment]:
    if drain is None:
        return service.take(worker_id, reports, long_poll, more)
    with drain.interruptible():
        return service.take(worker_id, reports, long_poll, more)


def _leave(config: WorkerConfig, worker_id: str, reports: list[Report], remote: bool) -> None:
    # A fresh connection: a take interrupted by SIGTERM left the old one mid-reply.
    with contextlib.suppress(Exception):
        service = connect_service(config.address, config.authkey)
        if remote:
            service.leave(worker_id, reports)
        else:
            service.finish(worker_id, reports)


def _should_recycle(config: WorkerConfig, done: int) -> bool:
    if config.max_tasks is not None and done >= config.max_tasks:
        return True
    if config.max_memory is not None:
        return bool(psutil.Process().memory_info().rss > config.max_memory)
    return False
