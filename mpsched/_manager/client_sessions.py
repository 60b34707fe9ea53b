"""ClientSessions: how outcomes reach a client, from its hello to its last connection.

A client opens its mailbox (its versions checked), long-polls it with ``collect``, and
watches jobs it did not submit. When every connection speaking for it has ended, its
mailbox is dropped (mpsched._manager.client_connections).
"""

from __future__ import annotations

import logging

from mpsched._core.queue_like import JobQueueLike
from mpsched._errors import JobNotFoundError
from mpsched._manager.client_connections import ClientConnections
from mpsched._manager.journal import BaseJournal
from mpsched._manager.mailbox import Mailboxes
from mpsched._manager.schedules import Schedules
from mpsched._manager.versions import Versions
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import OutcomeWire, outcome_to_wire
from mpsched._protocol.records import LONG_POLL, ClientHello

log = logging.getLogger("mpsched.manager")


class ClientSessions:
    """The clients' mailboxes and watches: opening, collecting, watching, going away."""

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        mailboxes: Mailboxes,
        segments: Segments,
        schedules: Schedules,
        versions: Versions,
    ) -> None:
        self._queue = queue
        self._journal = journal
        self._mailboxes = mailboxes
        self._segments = segments
        self._schedules = schedules
        self._versions = versions
        # Which client each connection speaks for: when all of one's have ended, nobody
        # can collect its outcomes (connection_closed), and its mailbox is dropped.
        self._connections = ClientConnections()

    def open(self, hello: ClientHello) -> int | None:
        """Register a client; returns the queue's max_pending."""
        self._versions.check(f"client {hello.client_id}", (hello.python, hello.cloudpickle))
        self._mailboxes.open(hello.client_id)
        self._connections.speaks_for(hello.client_id)
        return self._queue.max_pending

    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[OutcomeWire] | None:
        """The outcomes in a client's mailbox, waiting up to ``timeout`` (at most
        LONG_POLL) for some; None once its mailbox is closed."""
        self._connections.speaks_for(client_id)
        self._segments.collecting(client_id)
        outcomes = self._mailboxes.collect(client_id, min(timeout, LONG_POLL), waiting)
        if outcomes:
            self._segments.handed(client_id, outcomes)
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
        dropped = self._mailboxes.drop(client_id)
        self._segments.client_gone(client_id)
        if dropped is not None:
            log.info("client %s went away; %d uncollected outcome(s) discarded", client_id, dropped)

    def watch(self, client_id: str, job_id: str) -> OutcomeWire | None:
        """Watch a job: its outcome if known now, else None (see ManagerService.watch).

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        try:
            outcome = self._journal.watch(client_id, job_id)
        except JobNotFoundError:
            outcome = self._schedules.outcome(job_id)  # kept for runs even without a store
            if outcome is None:
                raise
        return None if outcome is None else outcome_to_wire(outcome)

    def watch_many(self, client_id: str, job_ids: list[str]) -> tuple[list[OutcomeWire], list[str]]:
        """:meth:`watch` each job: the outcomes of those that have ended, and the ids of
        those this manager does not know."""
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
