"""ManagerService: the one object a manager process serves to clients and workers.

It joins the pure JobQueue (heap, leases) and its journal with what only a served object
needs: the workers table (mpsched._manager.worker_table), per-client result mailboxes,
version checks and the statistics ``status`` shows. Each public method is one proxied call and runs
in the server thread of the caller's connection (mpsched._protocol.proxy.ServiceProxy is the
other side).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock
from mpsched._core.job import (
    DEFAULT_QUEUE,
    After,
    Job,
    JobRecord,
    JobState,
    Lease,
    PayloadOptions,
    Priority,
    check_name,
)
from mpsched._core.limits import LimitSpec, parse_limit
from mpsched._core.queue import JobQueue
from mpsched._core.recurring import ScheduleAction, ScheduleInfo, ScheduleSpec
from mpsched._errors import (
    JobNotFoundError,
    StoreError,
    VersionMismatchError,
)
from mpsched._manager.client_connections import ClientConnections
from mpsched._manager.dispatch import Dispatch
from mpsched._manager.endings import Endings
from mpsched._manager.failures import RecentFailures, described
from mpsched._manager.journal import BaseJournal, NoJournal
from mpsched._manager.mailbox import Mailboxes
from mpsched._manager.schedules import Schedules
from mpsched._manager.shared_journal import SharedJournal
from mpsched._manager.shared_queue import SharedQueue
from mpsched._manager.store_journal import Journal
from mpsched._manager.worker_table import WorkerTable
from mpsched._manager.workflows import Workflows, check_after
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import (
    AssignmentWire,
    JobRequestWire,
    OutcomeWire,
    ReportWire,
    outcome_to_wire,
    report_from_wire,
    request_from_wire,
)
from mpsched._protocol.proxy import (
    remote,
)
from mpsched._protocol.records import (
    HEARTBEAT_TIMEOUT,
    LONG_POLL,
    ClientHello,
    LeftBehind,
    QueueStatus,
    Stats,
    WorkerHello,
    WorkerLoad,
)
from mpsched._transport.sockets import describe_versions, host_name

log = logging.getLogger("mpsched.manager")

THROUGHPUT_WINDOW = 10.0  # seconds over which stats() measures throughput


class ManagerService:
    """The object the manager serves; each public method is one proxied call.

    Where it sits on the path of a job, from a client's submit to its result, and the locks
    of what it holds: docs/architecture.md.
    """

    def __init__(
        self,
        queue: JobQueue | SharedQueue,
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
        # What happens to each job, journalled to the store (nothing without one).
        if journal is None:
            assert isinstance(queue, JobQueue), "a shared queue comes with its journal"
            journal = NoJournal(queue)
        self.journal = journal
        self._clock = clock if clock is not None else SystemClock()
        self.segments = segments if segments is not None else Segments()
        self.mailboxes = Mailboxes(on_discard=self.segments.discarded)
        self.failures = RecentFailures()  # the latest failed jobs, for the dashboard
        self.heartbeat_timeout = heartbeat_timeout
        self.versions = describe_versions()
        self.host = host_name()
        self.workers = WorkerTable(local_token=secrets.token_hex(16))
        # Which client each connection speaks for: when all of one's have ended, nobody
        # can collect its outcomes (connection_closed), and its mailbox is dropped.
        self._connections = ClientConnections()
        # The supervisor's counts (written by its thread only, through note_workers()); read
        # by stats().
        self._workers_missing = 0
        self._worker_start_failures = 0
        self._started = time.monotonic()
        # Set once stop() is called; the supervisor sees it through the wake pipe.
        self.stopping = threading.Event()
        self.drain_workers_on_stop = drain_workers_on_stop
        self.wake_reader, self._wake_writer = os.pipe()
        # How jobs end and their outcomes reach clients (mpsched._manager.endings).
        self.endings = Endings(
            queue,
            self.journal,
            self.segments,
            self.mailboxes,
            self.failures,
            self.workers,
            self.stopping,
            run_ended=lambda job_id, outcome: self.schedules.events.ended(job_id, outcome),
        )
        # Recurring schedules; their runs are jobs of this queue (mpsched._manager.schedules).
        self.schedules = Schedules(self.journal, self._clock, self.endings.cancelled)
        # Ends that another manager of a shared store recorded come in through this.
        self.journal.bind(self.endings.deliver)
        # Jobs that wait for their parents, out of the heap (mpsched._manager.workflows);
        # None with a shared store, which refuses them.
        self.workflows: Workflows | None = None
        if isinstance(queue, JobQueue):
            self.workflows = Workflows(queue, self.journal)
            self.workflows.deliver = self.endings.deliver
            self.endings.on_ended = self.workflows.ended
            if isinstance(self.journal, NoJournal):
                self.journal.waiting_jobs = self.workflows
            elif isinstance(self.journal, Journal):
                self.workflows.recover(self.journal.recovered_waiting)
                self.journal.recovered_waiting = []
        # Due jobs handed to workers (mpsched._manager.dispatch).
        self.dispatch = Dispatch(
            queue,
            self.journal,
            self.schedules.events,
            self.workers,
            self.segments,
            self._clock,
            self.wake_supervisor,
        )

    def wake_supervisor(self) -> None:
        """Wake the supervisor loop (it waits on ``wake_reader`` with the worker sentinels)."""
        os.write(self._wake_writer, b"x")

    # ------------------------------------------------------------------ workers

    @remote
    def hello(self, hello: WorkerHello) -> float:
        """Register a worker; returns the heartbeat timeout its heartbeats must beat."""
        self._check_versions(
            f"worker {hello.worker_id} on {hello.host}", (hello.python, hello.cloudpickle)
        )
        self.workers.join(hello)
        self.wake_supervisor()
        log.info("worker %s joined (pid %d on %s)", hello.worker_id, hello.pid, hello.host)
        return self.heartbeat_timeout

    @remote
    def take(
        self, worker_id: str, reports: list[ReportWire] | None, timeout: float, more: int = 0
    ) -> list[AssignmentWire]:
        """Report the jobs of the worker's last batch (if any), then wait for the next due
        job: returns it, with up to ``more`` due jobs prefetched for a worker this manager
        started (mpsched._core.prefetch); [] when none became due within ``timeout``."""
        local = self.workers.check_in(worker_id, reported=len(reports or ()))
        if reports:  # a shared store claims its next jobs with these ends: as many
            self.endings.complete_all(
                [report_from_wire(r) for r in reports],
                worker_id,
                same_clock=local,
                more=more if local else 0,
            )
        return self.dispatch.take(worker_id, local, timeout, more)

    @remote
    def report(self, worker_id: str, reports: list[ReportWire]) -> None:
        """Report jobs a worker ran while it holds more of its batch: sent as they end
        (by its reporter thread) rather than with its next take."""
        local = self.workers.check_in(worker_id, reported=len(reports), busy=True)
        self.endings.complete_all(
            [report_from_wire(r) for r in reports], worker_id, same_clock=local
        )

    @remote
    def ack(self, worker_id: str, lease_id: int) -> None:
        """A remote worker received a lease: from now on losing it counts as an attempt."""
        self.workers.update(worker_id, acked=lease_id)

    @remote
    def progress(self, worker_id: str, updates: list[tuple[int, str, str]]) -> None:
        """The latest progress of jobs a worker runs, (lease id, job id, JSON text) each,
        coalesced by the worker; an update of a job that has ended is dropped."""
        for lease_id, job_id, progress in updates:
            try:
                self.journal.progress(lease_id, job_id, progress)
            except StoreError as exc:  # progress is news, not state: the job goes on
                log.warning("the progress of job %s was not recorded: %s", job_id, exc)

    @remote
    def retry_budget(self, job_id: str) -> int:
        """How many times a job may run again after its current run fails: its retry
        policy's ``max_retries``, else its ``retries=``. The one place that says it to a
        job (JobContext.max_retries).

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        job = self.queue.leases.job_of(job_id)  # it runs: on this manager's leases
        if job is not None:
            return job.retry.max_retries if job.retry is not None else job.retries
        record = self.journal.get(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return record.retries

    @remote
    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self.workers.check_in(worker_id, reported=0)
        self.workers.update(worker_id, load=load)

    @remote
    def finish(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """Report the last jobs of a worker that is leaving to be replaced (recycling); the
        prefetched jobs it did not start go back to the heap."""
        if reports:
            local = self.workers.check_in(worker_id, reported=len(reports))
            self.endings.complete_all(
                [report_from_wire(r) for r in reports], worker_id, same_clock=local
            )
        self.queue.revoke(worker_id)

    @remote
    def leave(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """A remote worker leaves (drained): report its last jobs and end its leases."""
        self.finish(worker_id, reports)
        self.lose_worker(worker_id, exitcode=0)

    @remote
    def worker_exited(
        self, worker_id: str, exitcode: int | None, left: LeftBehind | None = None
    ) -> None:
        """A remote worker is gone: its pool saw its process exit (a negative code: killed
        by that signal; None: its pool died, and the next one found its slot), or it joined
        again under a new id (None). Resolve the jobs it held now, not at its heartbeat
        deadline: by ``left``, what its claim slot says, when there is one."""
        if left is None:
            held = self.lose_worker(worker_id, exitcode)
        else:
            held = self.endings.resolve_left(worker_id, exitcode, left, same_clock=False)
        if held and exitcode is not None:
            log.error(
                "remote worker %s exited with code %s holding %d job(s)", worker_id, exitcode, held
            )
        elif held:
            log.warning(
                "remote worker %s is gone (its pool, or it, said so) holding %d job(s)",
                worker_id,
                held,
            )

    def resolve_left(self, worker_id: str, exitcode: int | None, left: LeftBehind) -> int:
        """A local worker exited, and its durable claim slot says what it left: see
        Endings.resolve_left; returns how many leases it held besides the ended ones."""
        return self.endings.resolve_left(worker_id, exitcode, left, same_clock=True)

    def recover_reports(self, worker_id: str, kept: list[bytes]) -> int:
        """A local worker exited: end the jobs it ran whose reports it kept in its claim
        slot (see Endings.recover); returns how many were still in flight."""
        return self.endings.recover(worker_id, kept)

    def lose_worker(
        self, worker_id: str, exitcode: int | None, received: Callable[[Lease], bool] | None = None
    ) -> int:
        """Forget a worker and resolve each job it held; returns how many it held (see
        Endings.lose_worker)."""
        return self.endings.lose_worker(worker_id, exitcode, received)

    def expired_remote(self) -> tuple[list[str], float | None]:
        """Remote workers silent past the heartbeat timeout, and the next such deadline."""
        return self.workers.expired_remote(self.heartbeat_timeout)

    def worker_count(self) -> int:
        return len(self.workers)

    def expired_leases(self) -> tuple[list[Lease], float | None]:
        """Leases past their job's timeout, and the earliest such deadline still ahead."""
        return self.queue.expired()

    def retire_for_kill(self, worker_id: str, lease_id: int) -> bool:
        """Before a local worker is killed for a job past its timeout: True if that job's
        lease is still in flight, and then the worker is handed no other job (see
        JobQueue.retire_if_leased); False if it reported the job meanwhile."""
        return self.queue.retire_if_leased(worker_id, lease_id)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until no job runs; False if some still do after ``timeout`` seconds."""
        return self.queue.wait_drained(timeout)

    def note_workers(self, missing: int, start_failed: bool = False) -> None:
        """The supervisor's count of workers it could not start again yet, and whether an
        attempt to start one just failed (for stats())."""
        self._workers_missing = missing
        self._worker_start_failures += start_failed

    # ------------------------------------------------------------------ clients

    @remote
    def open_client(self, hello: ClientHello) -> int | None:
        """Register a client; returns the queue's max_pending (a client batches below it)."""
        self._check_versions(f"client {hello.client_id}", (hello.python, hello.cloudpickle))
        self.mailboxes.open(hello.client_id)
        self._connections.speaks_for(hello.client_id)
        return self.queue.max_pending

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
        bounded = LONG_POLL if timeout is None else min(timeout, LONG_POLL)
        batch = [request_from_wire(r) for r in requests]
        routed = [r for r in batch if r.limit is not None or r.queue != DEFAULT_QUEUE]
        if routed:  # before the store: a refused batch leaves no trace
            self.queue.check_routes(routed)
        self.segments.submitted(batch)  # before a worker can take and end one
        try:
            holders = self.journal.submit(batch, bounded)
        except BaseException:
            self.segments.refused(batch)
            raise
        if holders is not None:  # jobs not queued: another job holds their key
            self.segments.ended(
                r.job_id for r, h in zip(batch, holders, strict=True) if h != r.job_id
            )
        if withdrawn:
            self.queue.count_withdrawn(withdrawn)
        return holders

    @remote
    def submit_after(self, requests: list[JobRequestWire], afters: list[After]) -> None:
        """Journal and queue jobs that wait for their parents, all or none: each enters
        the heap once every parent has ended (see Workflows.submit).

        Raises:
            InvalidJobError: bad parents (Workflows.submit).
            JobNotFoundError: a parent this manager (or its shared store) does not know.
        """
        batch = [request_from_wire(r) for r in requests]
        afters = [After._make(a) for a in afters]
        for request, after in zip(batch, afters, strict=True):
            check_after(request, after)
        self.segments.submitted(batch)
        try:
            if self.workflows is not None:
                self.workflows.submit(batch, afters)
            else:
                assert isinstance(self.journal, SharedJournal)
                self.journal.submit_after(batch, afters)
        except BaseException:
            self.segments.refused(batch)
            raise

    @remote
    def payload_options(self) -> PayloadOptions:
        """How clients send payloads: the shared-memory prefix (and its probe) and the
        bound on pending payload bytes."""
        return self.segments.options(self.queue.max_pending_bytes, self.journal.max_payload)

    @remote
    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        """Cancel a pending job; False if it is not pending. ``client_id``: the client
        asking, when it need not be the job's own (``Client.cancel(job_id)``): the job's
        own client is then told too, so its future ends cancelled."""
        owner = self.journal.owner(job_id) if client_id is not None else None
        jobs = self.queue.cancel_jobs([job_id]) or self._cancel_waiting([job_id])
        if not jobs:
            return False
        tell_owner = owner is not None and owner != client_id
        self.endings.cancelled(jobs, {job_id: {owner}} if owner and tell_owner else None)
        return True

    @remote
    def requeue(self, client_id: str, job_id: str) -> None:
        """Put a failed or cancelled job back in the queue by id, due now, with its
        options and no attempt made; its end goes to ``client_id`` (see
        BaseJournal.requeue_ended, which raises what this raises)."""
        self.journal.requeue_ended(client_id, job_id)
        log.info("job %s requeued by client %s", job_id, client_id)

    @remote
    def cancel_many(self, job_ids: list[str]) -> list[str]:
        """Cancel pending jobs of the caller; returns the ids of those that were pending."""
        jobs = self.queue.cancel_jobs(job_ids)
        if self.workflows is not None and len(self.workflows) and len(jobs) < len(job_ids):
            jobs += self._cancel_waiting(job_ids)
        return self.endings.cancelled(jobs)

    def _cancel_waiting(self, job_ids: list[str]) -> list[Job]:
        """Take out the jobs among ``job_ids`` that wait for their parents."""
        if self.workflows is None:
            return []
        jobs = self.workflows.cancel(job_ids)
        if jobs:
            self.queue.count_withdrawn(len(jobs))
        return jobs

    @remote
    def not_due(self, client_id: str) -> list[str]:
        """The client's pending jobs not yet due (they stay in the store at its exit)."""
        waiting = (
            []
            if self.workflows is None or not len(self.workflows)
            else [job.job_id for job, _n in self.workflows.listing() if job.client_id == client_id]
        )
        return self.queue.not_due(client_id) + waiting

    @remote
    def cancel_client(self, client_id: str, not_due_only: bool = False) -> list[str]:
        jobs = self.queue.cancel_client_jobs(client_id, not_due_only=not_due_only)
        if self.workflows is not None and len(self.workflows):
            waiting = self.workflows.cancel_client(client_id)
            self.queue.count_withdrawn(len(waiting))
            jobs += waiting
        return self.endings.cancelled(jobs)

    @remote
    def watch(self, client_id: str, job_id: str) -> OutcomeWire | None:
        """Watch a job ``client_id`` did not submit (or submitted before a restart): its
        outcome if it is known now (the caller resolves its future with it), else None
        and the outcome is sent to ``client_id`` when the job ends.

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        try:
            outcome = self.journal.watch(client_id, job_id)
        except JobNotFoundError:
            outcome = self.schedules.outcome(job_id)  # kept for runs even without a store
            if outcome is None:
                raise
        return None if outcome is None else outcome_to_wire(outcome)

    @remote
    def watch_many(self, client_id: str, job_ids: list[str]) -> tuple[list[OutcomeWire], list[str]]:
        """:meth:`watch` each job (a client that reconnected re-attaches its futures):
        the outcomes of those that have ended, and the ids of those this manager does not
        know. A client may watch its own jobs: that adds no second delivery."""
        outcomes: list[OutcomeWire] = []
        unknown: list[str] = []
        for job_id in job_ids:
            try:
                outcome = self.watch(client_id, job_id)
            except JobNotFoundError:
                unknown.append(job_id)
                continue
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes, unknown

    @remote
    def job(self, job_id: str) -> JobRecord | None:
        """The record of one job the manager knows (None: it knows no such job), without
        its outcome."""
        record = self.journal.get(job_id, fresh=True)
        return None if record is None else described(self._waiting(record))

    @remote
    def jobs(self, state: str | None = None, limit: int | None = None) -> list[JobRecord]:
        """The jobs the store knows, in submission order (pending and running ones only
        without a store), without payloads or outcomes; a failed job with its error, a
        pending one with what it waits for."""
        return [described(self._waiting(r)) for r in self.journal.jobs(state, limit)]

    def _waiting(self, record: JobRecord) -> JobRecord:
        """``record`` with what it waits for, if it is a pending job of a limit or one
        waiting for its parents."""
        if record.state is not JobState.PENDING:
            return record
        if self.workflows is not None and len(self.workflows):
            parents = self.workflows.remaining(record.job_id)
            if parents:
                return record._replace(waiting_for=f"after {parents} jobs")
        if record.limit is None:
            return record
        return record._replace(waiting_for=self.queue.waiting_for(record.job_id))

    @remote
    def limits(self) -> dict[str, str]:
        """The declared limits by name, in their forms ("2", "10/s", "2,10/s")."""
        return {name: str(spec) for name, spec in self.queue.limits().items()}

    @remote
    def set_limit(self, name: str, form: str) -> None:
        """Declare or change a limit (``form`` "" for one without bounds), kept in the
        store; parked jobs it now admits are takeable at once."""
        check_name("limit", name)
        spec = parse_limit(name, form) if form else LimitSpec()
        self.journal.save_limit(name, str(spec))
        self.queue.set_limit(name, spec)
        log.info("limit %s set to %s", name, spec or "no bound")

    @remote
    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[OutcomeWire] | None:
        self._connections.speaks_for(client_id)
        self.segments.collecting(client_id)
        outcomes = self.mailboxes.collect(client_id, min(timeout, LONG_POLL), waiting)
        if outcomes:
            self.segments.handed(client_id, outcomes)
        return None if outcomes is None else [outcome_to_wire(o) for o in outcomes]

    def connection_closed(self) -> None:
        """Called in a connection's own server thread when the connection ends.

        If it was the last connection of a client (the one that opened it, or its result
        connection), nobody can collect that client's outcomes any more: its mailbox is
        dropped (its pending jobs still run; their outcomes are discarded). A client that
        closed itself properly has no mailbox left by now. A client that died before its
        result thread connected is caught by its opening connection.
        """
        client_id = self._connections.closed()
        if client_id is None:
            return
        dropped = self.mailboxes.drop(client_id)
        self.segments.client_gone(client_id)
        if dropped is not None:
            log.info("client %s went away; %d uncollected outcome(s) discarded", client_id, dropped)

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

    @remote
    def stats(self, lateness: bool = True) -> Stats:
        """The scheduler's state; ``lateness`` False leaves out the recent lateness
        percentiles (the status page's poll and a scrape need none: they read the
        lateness histogram, and sorting 10,000 samples holds the GIL for milliseconds)."""
        now = time.monotonic()
        workers, recent = self.workers.statuses(since=now - THROUGHPUT_WINDOW)
        window = min(THROUGHPUT_WINDOW, max(now - self._started, 1e-9))
        queue = self.queue.stats(lateness=lateness)
        if self.workflows is not None and len(self.workflows):  # waiting: pending too
            waiting = self.workflows.waiting_levels()
            queue = dataclasses.replace(
                queue,
                pending={
                    p.name.lower(): queue.pending[p.name.lower()] + waiting[p.level]
                    for p in Priority
                },
            )
        return Stats(
            queue=queue,
            workers=workers,
            uptime=now - self._started,
            throughput=recent / window,
            workers_missing=self._workers_missing,
            worker_start_failures=self._worker_start_failures,
            clients=len(self.mailboxes),
            store=self.journal.store.location,
            store_size=self.journal.store.size(),
            store_jobs=self.journal.store.kept() if self.journal.shared else None,
            managers=self.journal.managers(workers),
            queues=self._queue_statuses(),
            limits=tuple(sorted(self.limits().items())),
        )

    def _queue_statuses(self) -> tuple[QueueStatus, ...]:
        """Each queue with pending jobs or a worker naming it: its pending count and how
        many of this manager's workers serve it."""
        pending = self.queue.pending_by_queue()
        served = self.workers.subscriptions()
        names = {name for name, count in pending.items() if count}
        names.update(name for queues in served if queues for name in queues)
        names.add(DEFAULT_QUEUE)
        return tuple(
            QueueStatus(
                name=name,
                pending=pending.get(name, 0),
                workers=sum(1 for q in served if q is None or name in q),
            )
            for name in sorted(names)
        )

    @remote
    def drain_workers(self) -> int:
        """Dismiss every remote worker connected now: its next take (within LONG_POLL for an
        idle one) tells it that its pool leaves, and the pool drains (running jobs finish
        and are reported) and exits. Returns how many workers were dismissed."""
        dismissed = self.workers.dismiss_remote()
        log.warning("dismissed %d remote worker(s): their pools drain and exit", dismissed)
        return dismissed

    def wait_workers_told(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every dismissed worker has been told (so its
        pool exits instead of waiting for the manager to come back)."""
        return self.workers.wait_told(timeout)

    @remote
    def stop(self) -> None:
        """Stop handing out jobs; the manager process then drains, stops workers, exits.
        Remote workers wait for a manager to come back at the address, unless
        ``drain_workers_on_stop``: then they are dismissed first (their pools exit)."""
        if self.drain_workers_on_stop and not self.stopping.is_set():
            log.info(
                "stopping: dismissed %d remote worker(s); their pools drain and exit",
                self.workers.dismiss_remote(),
            )
        self.stopping.set()
        self.schedules.close()
        self.queue.close()
        self.wake_supervisor()

    def _check_versions(self, peer: str, theirs: tuple[str, str]) -> None:
        if theirs != self.versions:
            error = VersionMismatchError(peer, self.versions, theirs)
            log.warning("refused %s", error)
            raise error
