"""Per-client mailboxes: outcomes wait here for their submitting client's result thread."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mpsched._core.job import Outcome

log = logging.getLogger("mpsched.manager")

# A result thread that finds fewer outcomes than its client still waits for (up to BATCH)
# waits up to LINGER for more, so that under load one reply carries many outcomes: a
# reply costs the manager and the client a wake-up and a call each, whatever it carries.
# It lingers only while outcomes stream in: while, on average (GAP_WEIGHT), they come less
# than LINGER / 2 apart, so that more are due within LINGER. Outcomes further apart go at
# once (jobs longer than LINGER, even two workers ending theirs together): lingering would
# hold each back by LINGER and wake the thread for nothing. A client that waits for nothing
# more (one job at a time) gets its outcome at once. Lingering only delays results, never
# job starts. A result thread that finds the box empty while outcomes stream first waits
# LINGER for them all, and is woken once they are in, not also for the first.
BATCH = 64
LINGER = 0.010
GAP_WEIGHT = 0.25  # of the latest gap between two outcomes in their moving average
# One collect() reply carries at most this many outcomes and, past the first, this many
# payload bytes: a reply must never fail to pickle or exhaust memory. The rest waits for
# the next call, which returns at once.
REPLY_OUTCOMES = 4096
REPLY_BYTES = 64 * 2**20


@dataclass(eq=False)
class _Mailbox:
    ready: threading.Condition  # over Mailboxes._lock; its client's result thread waits
    outcomes: deque[Outcome] = field(default_factory=deque)
    closed: bool = False
    # How many outcomes its waiter waits for (the first, or more while it lingers or
    # gathers them in an empty box): post() notifies it when there are that many, not before.
    wanted: int = 1
    # When the latest outcome came (monotonic), and the moving average of the gaps between
    # outcomes (each counted as at most 2 * LINGER: further apart is apart enough).
    last_post: float = -math.inf
    gap: float = math.inf

    def streaming(self) -> bool:
        """Whether outcomes come close enough together for lingering to gather some."""
        return self.gap < LINGER / 2


class Mailboxes:
    """Outcomes waiting for their submitting client's result thread."""

    def __init__(self, on_discard: Callable[[Outcome], None] | None = None) -> None:
        """``on_discard`` is called (without the lock) with each outcome thrown away
        because its client is gone."""
        self._on_discard = on_discard
        # Guards _boxes and every mailbox in it.
        self._lock = threading.Lock()
        # A stopping manager waits here (wait_collected) for the boxes to empty; collect()
        # notifies it each time it empties one.
        self._emptied = threading.Condition(self._lock)
        self._boxes: dict[str, _Mailbox] = {}

    def open(self, client_id: str) -> None:
        with self._lock:
            self._boxes.setdefault(client_id, _Mailbox(threading.Condition(self._lock)))

    def post(self, client_id: str, outcome: Outcome) -> None:
        # A closed mailbox still takes outcomes: its client collects them before it is
        # told the box is closed (a stopping manager waits for that in wait_collected()).
        with self._lock:
            box = self._boxes.get(client_id)
            if box is not None:
                now = time.monotonic()
                gap, box.last_post = min(now - box.last_post, 2 * LINGER), now
                box.gap = gap if box.gap > 2 * LINGER else box.gap + (gap - box.gap) * GAP_WEIGHT
                box.outcomes.append(outcome)
                if len(box.outcomes) == box.wanted:  # what its waiter waits for
                    box.ready.notify()
                return
        log.debug("discarded the outcome of job %s: client %s is gone", outcome.job_id, client_id)
        if self._on_discard is not None:
            self._on_discard(outcome)

    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[Outcome] | None:
        """The outcomes waiting for ``client_id`` (up to REPLY_OUTCOMES / REPLY_BYTES),
        after at most ``timeout`` seconds; with fewer at hand than ``waiting`` (how many
        the client still waits for) and BATCH, up to LINGER more for others to come.

        Returns None once the mailbox is closed and empty (and forgets it).
        """
        with self._lock:
            box = self._boxes.get(client_id)
            if box is None:
                return None
            self._wait_locked(box, timeout, min(waiting, BATCH))
            if not box.outcomes:
                if box.closed:
                    self._boxes.pop(client_id, None)
                    return None
                return []
            outcomes = [box.outcomes.popleft()]
            size = len(outcomes[0].payload)
            while box.outcomes and len(outcomes) < REPLY_OUTCOMES:
                size += len(box.outcomes[0].payload)
                if size > REPLY_BYTES:
                    break
                outcomes.append(box.outcomes.popleft())
            if not box.outcomes:
                self._emptied.notify_all()
            return outcomes

    @staticmethod
    def _wait_locked(box: _Mailbox, timeout: float, enough: int) -> None:
        """Wait up to ``timeout`` for an outcome, then, while outcomes stream in, up to
        LINGER for ``enough`` of them.

        An empty box whose client waits for several is first given LINGER to gather them,
        its collector woken only once they are in: under a stream of outcomes that is one
        wake-up a reply, not one for the first and one for the rest. Each outcome waits at
        most LINGER after it came.
        """
        if enough > 1 and timeout >= LINGER and box.streaming() and not box.outcomes:
            if _wait_for_locked(box, enough, LINGER):
                return
            box.gap += (2 * LINGER - box.gap) * GAP_WEIGHT  # LINGER without one: a gap
            timeout -= LINGER
        box.ready.wait_for(lambda: bool(box.outcomes) or box.closed, timeout)
        if box.outcomes and len(box.outcomes) < enough and box.streaming() and not box.closed:
            _wait_for_locked(box, enough, LINGER)

    def close(self, client_id: str | None = None) -> None:
        """Close one client's mailbox, or all; its result thread gets what is left.

        An empty mailbox closed by its own client is forgotten at once.
        """
        with self._lock:
            for cid, box in list(self._boxes.items()):
                if client_id is None or cid == client_id:
                    box.closed = True
                    box.ready.notify_all()
                    if client_id is not None and not box.outcomes:
                        del self._boxes[cid]

    def drop(self, client_id: str) -> int | None:
        """Forget a client that can no longer collect (its connection closed); returns how
        many outcomes were discarded (None: it had no mailbox). Later outcomes for it are
        discarded as they come."""
        with self._lock:
            box = self._boxes.pop(client_id, None)
            if box is None:
                return None
            self._emptied.notify_all()
        if self._on_discard is not None:
            for outcome in box.outcomes:
                self._on_discard(outcome)
        return len(box.outcomes)

    def __len__(self) -> int:
        """How many clients have a mailbox."""
        with self._lock:
            return len(self._boxes)

    def wait_collected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every mailbox is empty (its client took
        what was left); True if they all are."""
        with self._lock:
            return self._emptied.wait_for(
                lambda: not any(box.outcomes for box in self._boxes.values()), timeout
            )


def _wait_for_locked(box: _Mailbox, enough: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``enough`` outcomes in ``box`` (post() notifies when
    there are that many); True if it holds any, or was closed."""
    box.wanted = enough
    try:
        box.ready.wait_for(lambda: len(box.outcomes) >= enough or box.closed, seconds)
    finally:
        box.wanted = 1
    return bool(box.outcomes) or box.closed
