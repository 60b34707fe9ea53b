"""Per-client mailboxes: outcomes wait here for their submitting client's result thread."""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from mpsched._job import Outcome

log = logging.getLogger("mpsched.manager")


@dataclass(eq=False)
class _Mailbox:
    outcomes: deque[Outcome] = field(default_factory=deque)
    closed: bool = False


class Mailboxes:
    """Outcomes waiting for their submitting client's result thread."""

    def __init__(self) -> None:
        # Guards _boxes and every mailbox in it.
        self._lock = threading.Lock()
        # Each client's result thread waits here in collect(); post() and close() wake all
        # and every waiter re-checks its own mailbox. There is one result thread per
        # connected client, so this wakes as many threads as there are clients (usually 1).
        self._posted = threading.Condition(self._lock)
        self._boxes: dict[str, _Mailbox] = {}

    def open(self, client_id: str) -> None:
        with self._lock:
            self._boxes.setdefault(client_id, _Mailbox())

    def post(self, client_id: str, outcome: Outcome) -> None:
        # A closed mailbox still takes outcomes: its client collects them before it is
        # told the box is closed (a stopping manager waits for that in wait_collected()).
        with self._lock:
            box = self._boxes.get(client_id)
            if box is None:
                log.info("dropped the outcome of job %s: client %s is gone",
                         outcome.job_id, client_id)
                return
            box.outcomes.append(outcome)
            self._posted.notify_all()

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        """All outcomes waiting for ``client_id``, after at most ``timeout`` seconds.

        Returns None once the mailbox is closed and empty (and forgets it).
        """
        with self._lock:
            box = self._boxes.get(client_id)
            if box is None:
                return None
            self._posted.wait_for(lambda: bool(box.outcomes) or box.closed, timeout)
            if not box.outcomes:
                if box.closed:
                    self._boxes.pop(client_id, None)
                    return None
                return []
            outcomes = list(box.outcomes)
            box.outcomes.clear()
            self._posted.notify_all()  # wait_collected() watches the boxes empty
            return outcomes

    def close(self, client_id: str | None = None) -> None:
        """Close one client's mailbox, or all; its result thread gets what is left.

        An empty mailbox closed by its own client is forgotten at once.
        """
        with self._lock:
            for cid, box in list(self._boxes.items()):
                if client_id is None or cid == client_id:
                    box.closed = True
                    if client_id is not None and not box.outcomes:
                        del self._boxes[cid]
            self._posted.notify_all()

    def wait_collected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every mailbox is empty (its client took
        what was left); True if they all are."""
        with self._lock:
            return self._posted.wait_for(
                lambda: not any(box.outcomes for box in self._boxes.values()), timeout)
