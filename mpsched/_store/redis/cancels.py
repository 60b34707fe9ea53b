"""A Redis store's cancels: of pending jobs by id or by client, and the asks to the managers
that hold some prefetched to give them back (cancel.lua)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from mpsched._store.redis.records import Held, Withdrawn
from mpsched._store.redis.scripts import US, Scripts
from mpsched._store.redis.session import Session


class Cancels:
    """Cancels of pending jobs, and the asks for prefetched ones; the caller is ``me``."""

    def __init__(self, session: Session, scripts: Scripts, base: str) -> None:
        self._session = session
        self._scripts = scripts
        self._base = base

    def cancel_jobs(self, me: str, job_ids: Sequence[str]) -> list[Withdrawn]:
        """Cancel those of ``job_ids`` that are pending; the managers of their clients and
        watchers are told (``me`` tells its own: ``Withdrawn.mine``)."""
        with self._session.errors():
            return self._scripts.cancel(me, job_ids)[0]

    def cancel_or_ask(
        self, me: str, job_ids: Sequence[str], nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """:meth:`cancel_jobs`; and those a manager holds prefetched are marked under
        ``nonce``, and that manager asked to give them back (see the cancel script):
        :meth:`settle_cancel` says which were."""
        with self._session.errors():
            return self._scripts.cancel(me, job_ids, nonce=nonce)

    def settle_cancel(
        self, me: str, nonce: str, job_ids: Sequence[str], *, asked: int, wait: float
    ) -> list[Withdrawn]:
        """Wait up to ``wait`` seconds for the ``asked`` managers that :meth:`cancel_or_ask`
        asked to answer (on a list of the server's: no polling), then settle: those of
        ``job_ids`` that were given back and cancelled; the others had started (their
        cancel failed), or their manager did not answer in time."""
        client = self._session.client
        with self._session.errors():
            answer = f"{self._base}cr:{nonce}"
            deadline = time.monotonic() + wait
            while asked > 0 and (left := deadline - time.monotonic()) > 0:
                if client.blpop([answer], timeout=max(left, 0.001)) is None:
                    break
                asked -= 1
            client.delete(answer)
            return self._scripts.cancel(me, job_ids, nonce=nonce, settle=True)[0]

    def cancel_client(
        self, me: str, client_id: str, *, not_due_only: bool = False
    ) -> list[Withdrawn]:
        """Cancel every pending job of a client (only those not yet due)."""
        with self._session.errors():
            return self._scripts.cancel(me, (), client_id, not_due_only)[0]

    def cancel_client_or_ask(
        self, me: str, client_id: str, nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """:meth:`cancel_client`; and the client's jobs that any live manager holds
        prefetched (found among the managers' leases) are marked under ``nonce`` and
        their managers asked, as by :meth:`cancel_or_ask`."""
        with self._session.errors():
            return self._scripts.cancel(me, (), client_id, nonce=nonce)

    def not_yet_due(self, client_id: str) -> list[str]:
        """The ids of a client's pending jobs not yet due by the server's clock."""
        client = self._session.client
        with self._session.errors():
            now_s, now_us = client.time()
            now = now_s * US + now_us
            ids = client.zrangebyscore(f"{self._base}c:{client_id}", f"({now}", "+inf")
        return [i.decode() for i in ids]
