"""ServiceParts: the collaborators a ManagerService delegates to, and their wiring.

Each part owns one role of the served object: the workers' calls (WorkerSessions), the
clients' mailboxes and watches (ClientSessions), the submit and cancel path
(Submissions), the statistics and job records (Inspection), recurring schedules
(Schedules), the stop (ManagerStop), and beneath them how jobs are handed out (Dispatch)
and end (Endings).
"""

from __future__ import annotations

import secrets
import threading
from typing import NamedTuple

from mpsched._core.clock import Clock
from mpsched._core.queue import JobQueue
from mpsched._core.queue_like import JobQueueLike
from mpsched._manager.client_sessions import ClientSessions
from mpsched._manager.dispatch import Dispatch
from mpsched._manager.endings import Endings
from mpsched._manager.failures import RecentFailures
from mpsched._manager.inspection import Inspection
from mpsched._manager.journal import BaseJournal
from mpsched._manager.mailbox import Mailboxes
from mpsched._manager.manager_stop import ManagerStop
from mpsched._manager.no_journal import NoJournal
from mpsched._manager.schedules import Schedules
from mpsched._manager.store_journal import Journal
from mpsched._manager.submissions import Submissions
from mpsched._manager.versions import Versions
from mpsched._manager.worker_sessions import WorkerSessions
from mpsched._manager.worker_table import WorkerTable
from mpsched._manager.workflows import Workflows
from mpsched._payload.segments import Segments


class ServiceParts(NamedTuple):
    """The collaborators of one ManagerService, made by :func:`wire_parts`."""

    journal: BaseJournal
    segments: Segments
    mailboxes: Mailboxes
    failures: RecentFailures
    workers: WorkerTable
    endings: Endings
    schedules: Schedules
    workflows: Workflows | None
    stop: ManagerStop
    worker_sessions: WorkerSessions
    client_sessions: ClientSessions
    submissions: Submissions
    inspection: Inspection


def wire_parts(
    queue: JobQueueLike,
    journal: BaseJournal | None,
    clock: Clock,
    segments: Segments,
    heartbeat_timeout: float,
    drain_workers_on_stop: bool,
) -> ServiceParts:
    """Make and join the parts of a service of ``queue`` (see ManagerService).

    ``journal``: None for a manager without a store (a NoJournal of ``queue``).
    """
    if journal is None:
        assert isinstance(queue, JobQueue), "a shared queue comes with its journal"
        journal = NoJournal(queue)
    mailboxes = Mailboxes(on_discard=segments.discarded)
    failures = RecentFailures()  # the latest failed jobs, for the dashboard
    workers = WorkerTable(local_token=secrets.token_hex(16))
    versions = Versions()
    # Set once the manager stops (ManagerStop.stop); the supervisor sees it through the wake
    # pipe, and the ends of lost jobs read it.
    stopping = threading.Event()
    endings, schedules = _endings(
        queue, journal, segments, mailboxes, failures, workers, stopping, clock
    )
    # Ends that another manager of a shared store recorded come in through this.
    journal.bind(endings.deliver)
    workflows = _workflows(queue, journal, endings)
    stop = ManagerStop(queue, workers, schedules, stopping, drain_workers_on_stop)
    wake_supervisor = stop.wake_supervisor
    # Due jobs handed to workers.
    dispatch = Dispatch(queue, journal, schedules.events, workers, segments, clock, wake_supervisor)
    return ServiceParts(
        journal=journal,
        segments=segments,
        mailboxes=mailboxes,
        failures=failures,
        workers=workers,
        endings=endings,
        schedules=schedules,
        workflows=workflows,
        stop=stop,
        worker_sessions=WorkerSessions(
            queue,
            journal,
            workers,
            endings,
            dispatch,
            versions,
            heartbeat_timeout,
            wake_supervisor,
        ),
        client_sessions=ClientSessions(queue, journal, mailboxes, segments, schedules, versions),
        submissions=Submissions(queue, journal, segments, endings, workflows),
        inspection=Inspection(queue, journal, workers, mailboxes, workflows),
    )


def _endings(
    queue: JobQueueLike,
    journal: BaseJournal,
    segments: Segments,
    mailboxes: Mailboxes,
    failures: RecentFailures,
    workers: WorkerTable,
    stopping: threading.Event,
    clock: Clock,
) -> tuple[Endings, Schedules]:
    """How jobs end and their outcomes reach clients, and the recurring schedules, whose
    runs are jobs of this queue: each tells the other (runs that end, runs cancelled)."""
    endings = Endings(
        queue,
        journal,
        segments,
        mailboxes,
        failures,
        workers,
        stopping,
        run_ended=lambda job_id, outcome: schedules.events.ended(job_id, outcome),
    )
    schedules = Schedules(journal, clock, endings.cancelled)
    return endings, schedules


def _workflows(queue: JobQueueLike, journal: BaseJournal, endings: Endings) -> Workflows | None:
    """The jobs that wait for their parents, out of the heap, joined to how jobs end and
    to the journal; None with a shared store, which refuses them."""
    if not isinstance(queue, JobQueue):
        return None
    workflows = Workflows(queue, journal)
    workflows.deliver = endings.deliver
    endings.on_ended = workflows.ended
    if isinstance(journal, NoJournal):
        journal.waiting_jobs = workflows
    elif isinstance(journal, Journal):
        workflows.recover(journal.recovered_waiting)
        journal.recovered_waiting = []
    return workflows
