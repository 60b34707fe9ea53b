"""SharedCancels: cancels on a queue that several managers share in Redis.

A cancel withdraws the pending jobs it names in one script call. A job that a manager
claimed as prefetched and has not started is asked for: the script marks it and asks its
manager (a message on its channel) to give it back, and a job given back while marked is
cancelled (see lua/cancel.lua). This manager gives back its own at once, and waits up to
CANCEL_WAIT for the answers of the others.
"""

from __future__ import annotations

import secrets

from mpsched._core.job import Job
from mpsched._errors import StoreInDoubtError
from mpsched._manager.shared_doubts import LostAnswers
from mpsched._manager.shared_prefetch import SharedPrefetch
from mpsched._store.redis.records import Held, Withdrawn
from mpsched._store.redis.store import RedisStore

CANCEL_WAIT = 2.0  # seconds a cancel waits for the manager asked to give a job back


class SharedCancels:
    """The cancels one manager makes on a shared queue (see the module docstring)."""

    def __init__(
        self, store: RedisStore, manager_id: str, prefetch: SharedPrefetch, doubts: LostAnswers
    ) -> None:
        self._store = store
        self._me = manager_id
        self._prefetch = prefetch
        self._doubts = doubts

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Cancel those of ``job_ids`` that are pending, or prefetched by any manager and
        not started yet (that manager gives them back first, within CANCEL_WAIT); the
        jobs cancelled (their ids and clients) whose end this manager tells."""
        nonce = secrets.token_hex(8)
        try:
            withdrawn, asked = self._store.cancel_or_ask(self._me, job_ids, nonce)
        except StoreInDoubtError:
            self._doubts.recheck(job_ids)  # cancelled, maybe: its clients are told once it answers
            raise
        return self._settle(nonce, withdrawn, asked)

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """Cancel every pending job of a client, and those of its jobs that any manager
        holds prefetched and has not started (as :meth:`cancel_jobs`: within CANCEL_WAIT;
        a job that started runs to its end). With ``not_due_only``, only its pending jobs
        not yet due: a prefetched job is due."""
        if not_due_only:
            return _jobs(self._store.cancel_client(self._me, client_id, not_due_only=True))
        nonce = secrets.token_hex(8)
        withdrawn, asked = self._store.cancel_client_or_ask(self._me, client_id, nonce)
        return self._settle(nonce, withdrawn, asked)

    def _settle(self, nonce: str, withdrawn: list[Withdrawn], asked: list[Held]) -> list[Job]:
        """Finish a cancel under ``nonce``: give back this manager's own prefetched jobs
        it asked for, wait (CANCEL_WAIT at most) for the other managers asked, and settle;
        the jobs cancelled, as :meth:`cancel_jobs` returns them."""
        if asked:
            mine = [w.job_id for w in asked if w.holder == self._me]
            if mine:
                self._prefetch.give_back_for_cancel(mine, None)
            others = {w.holder for w in asked if w.holder != self._me}
            withdrawn += self._store.settle_cancel(
                self._me,
                nonce,
                [w.job_id for w in asked],
                asked=len(others),
                wait=CANCEL_WAIT,
            )
        return _jobs(withdrawn)


def _jobs(withdrawn: list[Withdrawn]) -> list[Job]:
    """The jobs a cancel withdrew, as a queue returns them (their ids and clients)."""
    return [
        Job(job_id=w.job_id, client_id=w.client_id, payload=b"", priority=0, due=0.0, seq=0)
        for w in withdrawn
    ]
