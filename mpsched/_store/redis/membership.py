"""A manager's membership of a Redis store: its heartbeats, the order all members share, its
leaving, the claims whose answers it never had, and its inbox of ended jobs it watches
(heartbeat.lua, leave.lua, unclaim.lua, watch.lua, drain.lua)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mpsched._core.job import Order
from mpsched._errors import ConfigError
from mpsched._store.redis.records import Beat, StoredEnd
from mpsched._store.redis.scripts import Scripts
from mpsched._store.redis.session import Session

log = logging.getLogger("mpsched.store")


class Membership:
    """A manager's heartbeats, the order its claims follow, and its inbox of ended jobs."""

    def __init__(self, session: Session, scripts: Scripts) -> None:
        self._session = session
        self._scripts = scripts

    @property
    def order(self) -> Order:
        """The order this manager's claims follow: its own, or the store's once a
        heartbeat found that to be another (see :meth:`heartbeat`)."""
        return self._scripts.order

    def heartbeat(
        self, me: str, lease_timeout: float, status: bytes, *, join: bool = False
    ) -> Beat:
        """Say ``me`` is alive for ``lease_timeout`` more seconds, with its status; take
        back the jobs of managers presumed dead. The store takes :attr:`order` when no
        other manager is live; else a manager that joins (``join``) with another order
        is refused, and one that beats again after it was presumed dead follows the
        store's (logged).

        Raises:
            ConfigError: (``join``) a live manager of the store has another order.
            StoreUnavailableError, StoreError: as ``Session.errors``.
        """
        session = self._session
        with session.errors():
            try:
                beat = self._scripts.heartbeat(me, lease_timeout, status, join=join)
            except session.redis.ResponseError as exc:
                theirs = str(exc).partition("ORDER ")[2].split()
                if not theirs:
                    raise
                raise ConfigError(
                    "order",
                    self.order.value,
                    f"{theirs[0]!r} (the order of the live managers of the store "
                    f"{session.url.redacted})",
                ) from None
        if beat.order is not self.order:
            log.error(
                "the job store %s has order=%r now (a manager started with it while "
                "this one was presumed dead): this manager follows it",
                session.url.redacted,
                beat.order.value,
            )
            self._scripts.order = beat.order
        return beat

    def forget_manager(self, me: str) -> int:
        """Forget a manager that stops; a job still leased to it (a claim whose answer
        it never had) goes back to the queue, its attempt not counted. Returns how many
        did."""
        with self._session.errors():
            return self._scripts.leave(me)

    def unclaim(self, me: str, claims: Sequence[str]) -> list[str]:
        """Undo the claims (by Take.claim) whose answers ``me`` never had: their jobs
        still leased to it go back to the queue, their attempts not counted. Call it
        once the server has answered a later call (every such claim has run by then, or
        never will). Returns the ids put back."""
        with self._session.errors():
            return self._scripts.unclaim(me, claims)

    def watch(self, me: str, job_id: str) -> StoredEnd | None:
        """Watch a job from ``me``: None for an unknown job, else where it stands
        (``StoredEnd.state``); unless it has ended, ``me`` is told when it ends (its inbox)."""
        with self._session.errors():
            return self._scripts.watch(me, job_id)

    def drain(self, me: str, count: int, done: int) -> list[StoredEnd]:
        """Up to ``count`` ended jobs from the head of ``me``'s inbox, once the ``done``
        ones the last call returned are dropped (``me`` delivered them): an answer that
        was lost is answered again."""
        with self._session.errors():
            return self._scripts.drain(me, count, done)
