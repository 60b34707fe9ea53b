"""A client's result thread at work: it collects the client's outcomes from the manager in
batches and resolves their futures, and when the manager is lost it rides the outage out
(mpsched._client.outage). The thread is the client core's (mpsched._client.core), which
closes the client when this returns.
"""

from __future__ import annotations

from typing import Protocol

from mpsched._client.link import DISCONNECTED, ManagerLink, describe
from mpsched._client.outage import ClientJobs, ride_out
from mpsched._client.outbox import Outbox
from mpsched._errors import MpschedError, SchedulerShutdownError
from mpsched._payload.segment_pool import SegmentPool
from mpsched._protocol.records import LONG_POLL


class Collecting(ClientJobs, Protocol):
    """What the result thread needs of its client's core."""

    client_id: str
    link: ManagerLink  # the manager's proxy, and the outage under way
    outbox: Outbox | None
    pool: SegmentPool | None  # the client's reusable segments, trimmed between collects

    @property
    def closed(self) -> bool:
        """The client closed its mailbox."""

    def waiting(self) -> int:
        """How many outcomes the client still waits for."""


def serve_outcomes(core: Collecting) -> MpschedError:
    """Resolve outcomes as they come, through outages when this client can reconnect;
    returns why it stopped."""
    while True:
        reason = _collect(core)
        if reason is None:  # this client closed its mailbox
            return SchedulerShutdownError("the mpsched manager stopped")
        failure = ride_out(core.link, core.link.begin(reason), core, core.outbox)
        if failure is not None:
            return failure


def _collect(core: Collecting) -> str | None:
    """Resolve outcomes until this client closes its mailbox (None) or loses the
    manager (returns how)."""
    service = core.link.service
    try:
        while (outage := core.link.outage) is None:  # another thread's call may lose it
            outcomes = service.collect(core.client_id, _trim_pool(core.pool), core.waiting())
            if outcomes is None:
                return None if core.closed else "the manager stopped"
            for outcome in outcomes:
                core.resolve(outcome)
        return outage.reason
    except DISCONNECTED as exc:
        return describe(exc)


def _trim_pool(pool: SegmentPool | None) -> float:
    """Unlink the segments that stayed free too long; returns how long the next
    collect may wait (the result thread is the one that trims them on time)."""
    return LONG_POLL if pool is None else min(LONG_POLL, pool.trim())
