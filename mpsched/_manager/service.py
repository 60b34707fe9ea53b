"""ManagerService: the one object a manager process serves to clients and workers.

It is the declared remote surface: each method marked ``@remote`` is one proxied call, run
in the server thread of the caller's connection (mpsched._protocol.proxy.ServiceProxy is the
other side), and hands the call to the part that owns its role
(mpsched._manager.service_parts): the workers' calls, the clients' mailboxes and watches,
the submit and cancel path, the statistics, the schedules. The supervisor and the status
server reach the same parts through its other public methods and attributes.
"""

from __future__ import annotations

import logging

from mpsched._core.clock import Clock, SystemClock
from mpsched._core.job import After, JobRecord, PayloadOptions
from mpsched._core.queue_like import JobQueueLike
from mpsched._core.recurring import ScheduleAction, ScheduleInfo, ScheduleSpec
from mpsched._manager.journal import BaseJournal
from mpsched._manager.service_parts import wire_parts
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import AssignmentWire, JobRequestWire, OutcomeWire, ReportWire
from mpsched._protocol.proxy import (
    remote,
)
from mpsched._protocol.records import (
    HEARTBEAT_TIMEOUT,
    ClientHello,
    LeftBehind,
    Stats,
    WorkerHello,
    WorkerLoad,
)
from mpsched._transport.sockets import host_name

log = logging.getLogger("mpsched.manager")


class ManagerService:
    """The object the manager serves; each public method is one proxied call.

    Where it sits on the path of a job, from a client's submit to its result, and the locks
    of what it holds: docs/architecture.md.
    """

    def __init__(
        self,
        queue: JobQueueLike,
        *,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        clock: Clock | None = None,
        journal: BaseJournal | None = None,
        segments: Segments | None = None,
        drain_workers_on_stop: bool = False,
    ) -> None:
        """``clock`` must be the queue's clock: it measures the delay a worker is sent.
        ``segments``: the shared-memory segments of payloads (none by default).
        ``drain_workers_on_stop``: :meth:`stop` dismisses the remote workers too."""
        self.queue = queue
        self.host = host_name()
        parts = wire_parts(
            queue,
            journal,
            clock if clock is not None else SystemClock(),
            segments if segments is not None else Segments(),
            heartbeat_timeout,
            drain_workers_on_stop,
        )
        # What the supervisor, the status server and main read: one role each.
        self.journal = parts.journal  # what happens to each job, journalled to the store
        self.segments = parts.segments
        self.mailboxes = parts.mailboxes
        self.failures = parts.failures
        self.workers = parts.workers
        self.endings = parts.endings
        self.schedules = parts.schedules
        self.workflows = parts.workflows
        self.stopping = parts.stop.stopping  # set once stop() is called (ManagerStop)
        self.wake_reader = parts.stop.wake_reader
        # The parts the remote calls are handed to.
        self._worker_sessions = parts.worker_sessions
        self._client_sessions = parts.client_sessions
        self._submissions = parts.submissions
        self._inspection = parts.inspection
        self._stop = parts.stop
        # The calls made per job or per batch, bound once: one call each.
        self._take = parts.worker_sessions.take
        self._report = parts.worker_sessions.report
        self._submit = parts.submissions.submit
        self._collect = parts.client_sessions.collect
        # What the supervisor and main call, not remote: the owning part's own methods.
        self.lose_worker = parts.worker_sessions.lose_worker
        self.resolve_left = parts.worker_sessions.resolve_left
        self.expired_remote = parts.worker_sessions.expired_remote
        self.recover_reports = parts.endings.recover
        self.expired_leases = queue.expired
        self.retire_for_kill = queue.retire_if_leased
        self.wait_drained = queue.wait_drained
        self.note_workers = parts.inspection.note_workers
        self.wait_workers_told = parts.workers.wait_told
        self.connection_closed = parts.client_sessions.connection_closed

    # ------------------------------------------------------------------ workers

    @remote
    def hello(self, hello: WorkerHello) -> float:
        """Register a worker; returns the heartbeat timeout its heartbeats must beat."""
        return self._worker_sessions.hello(hello)

    @remote
    def take(
        self, worker_id: str, reports: list[ReportWire] | None, timeout: float, more: int = 0
    ) -> list[AssignmentWire]:
        """Report the jobs of the worker's last batch (if any), then wait for the next due
        job: returns it, with up to ``more`` due jobs prefetched for a worker this manager
        started (mpsched._core.prefetch); [] when none became due within ``timeout``."""
        return self._take(worker_id, reports, timeout, more)

    @remote
    def report(self, worker_id: str, reports: list[ReportWire]) -> None:
        """Report jobs a worker ran while it holds more of its batch: sent as they end
        (by its reporter thread) rather than with its next take."""
        self._report(worker_id, reports)

    @remote
    def ack(self, worker_id: str, lease_id: int) -> None:
        """A remote worker received a lease: from now on losing it counts as an attempt."""
        self.workers.update(worker_id, acked=lease_id)

    @remote
    def progress(self, worker_id: str, updates: list[tuple[int, str, str]]) -> None:
        """The latest progress of jobs a worker runs, (lease id, job id, JSON text) each,
        coalesced by the worker; an update of a job that has ended is dropped."""
        self._worker_sessions.progress(worker_id, updates)

    @remote
    def retry_budget(self, job_id: str) -> int:
        """How many times a job may run again after its current run fails: its retry
        policy's ``max_retries``, else its ``retries=``. The one place that says it to a
        job (JobContext.max_retries).

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        return self._worker_sessions.retry_budget(job_id)

    @remote
    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self._worker_sessions.heartbeat(worker_id, load)

    @remote
    def finish(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """Report the last jobs of a worker that is leaving to be replaced (recycling); the
        prefetched jobs it did not start go back to the heap."""
        self._worker_sessions.finish(worker_id, reports)

    @remote
    def leave(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """A remote worker leaves (drained): report its last jobs and end its leases."""
        self._worker_sessions.leave(worker_id, reports)

    @remote
    def worker_exited(
        self, worker_id: str, exitcode: int | None, left: LeftBehind | None = None
    ) -> None:
        """A remote worker is gone: its pool saw its process exit (a negative code: killed
        by that signal; None: its pool died, and the next one found its slot), or it joined
        again under a new id (None). Resolve the jobs it held now, not at its heartbeat
        deadline: by ``left``, what its claim slot says, when there is one."""
        self._worker_sessions.exited(worker_id, exitcode, left)

    def worker_count(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------ clients

    @remote
    def open_client(self, hello: ClientHello) -> int | None:
        """Register a client; returns the queue's max_pending (a client batches below it)."""
        return self._client_sessions.open(hello)

    @remote
    def close_client(self, client_id: str) -> None:
        self.mailboxes.close(client_id)

    @remote
    def submit(
        self, requests: list[JobRequestWire], timeout: float | None, withdrawn: int = 0
    ) -> list[str] | None:
        """Journal and queue a batch of jobs, all or none (one job is a batch of one).

        Returns None when each job was queued as itself; else, for each, the id of the job
        that stands for it (a job whose ``key`` another live or retained job holds).
        ``withdrawn``: jobs the client submitted and cancelled before they were sent; they
        count as submitted and cancelled, so stats() agrees with what the caller did.
        """
        return self._submit(requests, timeout, withdrawn)

    @remote
    def submit_after(self, requests: list[JobRequestWire], afters: list[After]) -> None:
        """Journal and queue jobs that wait for their parents, all or none: each enters
        the heap once every parent has ended (see Workflows.submit).

        Raises:
            InvalidJobError: bad parents (Workflows.submit).
            JobNotFoundError: a parent this manager (or its shared store) does not know.
        """
        self._submissions.submit_after(requests, afters)

    @remote
    def payload_options(self) -> PayloadOptions:
        """How clients send payloads: the shared-memory prefix (and its probe) and the
        bound on pending payload bytes."""
        return self._submissions.payload_options()

    @remote
    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        """Cancel a pending job; False if it is not pending. ``client_id``: the client
        asking, when it need not be the job's own (``Client.cancel(job_id)``): the job's
        own client is then told too, so its future ends cancelled."""
        return self._submissions.cancel(job_id, client_id)

    @remote
    def requeue(self, client_id: str, job_id: str) -> None:
        """Put a failed or cancelled job back in the queue by id, due now, with its
        options and no attempt made; its end goes to ``client_id`` (see
        BaseJournal.requeue_ended, which raises what this raises)."""
        self._submissions.requeue(client_id, job_id)

    @remote
    def cancel_many(self, job_ids: list[str]) -> list[str]:
        """Cancel pending jobs of the caller; returns the ids of those that were pending."""
        return self._submissions.cancel_many(job_ids)

    @remote
    def not_due(self, client_id: str) -> list[str]:
        """The client's pending jobs not yet due (they stay in the store at its exit)."""
        return self._submissions.not_due(client_id)

    @remote
    def cancel_client(self, client_id: str, not_due_only: bool = False) -> list[str]:
        return self._submissions.cancel_client(client_id, not_due_only)

    @remote
    def watch(self, client_id: str, job_id: str) -> OutcomeWire | None:
        """Watch a job ``client_id`` did not submit (or submitted before a restart): its
        outcome if it is known now (the caller resolves its future with it), else None
        and the outcome is sent to ``client_id`` when the job ends.

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        return self._client_sessions.watch(client_id, job_id)

    @remote
    def watch_many(self, client_id: str, job_ids: list[str]) -> tuple[list[OutcomeWire], list[str]]:
        """:meth:`watch` each job (a client that reconnected re-attaches its futures):
        the outcomes of those that have ended, and the ids of those this manager does not
        know. A client may watch its own jobs: that adds no second delivery."""
        return self._client_sessions.watch_many(client_id, job_ids)

    @remote
    def job(self, job_id: str) -> JobRecord | None:
        """The record of one job the manager knows (None: it knows no such job), without
        its outcome."""
        return self._inspection.job(job_id)

    @remote
    def jobs(self, state: str | None = None, limit: int | None = None) -> list[JobRecord]:
        """The jobs the store knows, in submission order (pending and running ones only
        without a store), without payloads or outcomes; a failed job with its error, a
        pending one with what it waits for."""
        return self._inspection.jobs(state, limit)

    @remote
    def limits(self) -> dict[str, str]:
        """The declared limits by name, in their forms ("2", "10/s", "2,10/s")."""
        return self._inspection.limits()

    @remote
    def set_limit(self, name: str, form: str) -> None:
        """Declare or change a limit (``form`` "" for one without bounds), kept in the
        store; parked jobs it now admits are takeable at once."""
        self._inspection.set_limit(name, form)

    @remote
    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[OutcomeWire] | None:
        return self._collect(client_id, timeout, waiting)

    # ------------------------------------------------------------------ schedules

    @remote
    def add_schedule(self, spec: tuple[object, ...]) -> ScheduleInfo:
        """Add (or upsert) a recurring schedule; see Schedules.add."""
        return self.schedules.add(ScheduleSpec.of(spec))

    @remote
    def list_schedules(self) -> list[ScheduleInfo]:
        return self.schedules.listing()

    @remote
    def schedule_control(self, schedule_id: str, action: str) -> ScheduleInfo:
        """``info``, ``pause``, ``resume`` or ``cancel`` one schedule."""
        return self.schedules.control(schedule_id, ScheduleAction.coerce(action))

    @remote
    def schedule_preview(self, schedule_id: str, n: int) -> list[float]:
        return self.schedules.preview(schedule_id, n)

    @remote
    def schedule_runs(self, schedule_id: str, n: int) -> list[str]:
        return self.schedules.runs(schedule_id, n)

    # ------------------------------------------------------------------ the manager

    @remote
    def stats(self, lateness: bool = True) -> Stats:
        """The scheduler's state; ``lateness`` False leaves out the recent lateness
        percentiles (the status page's poll and a scrape need none: they read the
        lateness histogram, and sorting 10,000 samples holds the GIL for milliseconds)."""
        return self._inspection.stats(lateness)

    @remote
    def drain_workers(self) -> int:
        """Dismiss every remote worker connected now: its next take (within LONG_POLL for an
        idle one) tells it that its pool leaves, and the pool drains (running jobs finish
        and are reported) and exits. Returns how many workers were dismissed."""
        return self._stop.drain_workers()

    @remote
    def stop(self) -> None:
        """Stop handing out jobs; the manager process then drains, stops workers, exits.
        Remote workers wait for a manager to come back at the address, unless
        ``drain_workers_on_stop``: then they are dismissed first (their pools exit)."""
        self._stop.stop()
