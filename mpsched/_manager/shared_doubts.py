"""LostAnswers: the calls of a manager to Redis whose answers were lost.

Such a call may have run. A claim may have leased jobs to this manager without it knowing
them: once Redis answers a later call, the link undoes it (its jobs go back to the queue).
A cancel may have ended jobs: the link looks them up then, and tells their clients.
"""

from __future__ import annotations

import itertools
import logging

from mpsched._manager.shared_leases import SharedLeases

log = logging.getLogger("mpsched.manager")


class LostAnswers:
    """The claims and cancels of one manager whose answers Redis lost."""

    def __init__(self, shared: SharedLeases) -> None:
        self._store = shared.store
        self._me = shared.manager_id
        self._lock = shared.lock  # the queue's: guards the lists below
        self._claims_made = itertools.count(1)  # names each claim of this manager's
        # Claims that went out and got no answer (Redis may have run them): undone by
        # the link once Redis answers again (settle).
        self._doubtful: list[str] = []
        # Jobs a call whose answer was lost may have ended (a cancel): looked up by the
        # link once Redis answers, and their ends told here.
        self._recheck: list[str] = []

    def claim_name(self) -> str:
        """A name for the next claim (Take.claim), unique in this manager."""
        return str(next(self._claims_made))

    def in_doubt(self, claim: str) -> None:
        """A claim went out and its answer never came."""
        with self._lock:
            self._doubtful.append(claim)

    def recheck(self, job_ids: list[str]) -> None:
        """A call whose answer was lost may have ended these jobs."""
        with self._lock:
            self._recheck += job_ids

    def take_recheck(self) -> list[str]:
        """The jobs to look up (the caller gives them back with recheck on failure)."""
        with self._lock:
            job_ids, self._recheck = self._recheck, []
        return job_ids

    def settle(self) -> int:
        """Undo the claims whose answers never came; returns how many jobs went back.

        Raises:
            StoreUnavailableError: Redis did not answer; they are kept for the next try.
        """
        with self._lock:
            doubtful, self._doubtful = self._doubtful, []
        if not doubtful:
            return 0
        try:
            back = self._store.unclaim(self._me, doubtful)
        except BaseException:
            with self._lock:
                self._doubtful[:0] = doubtful
            raise
        if back:
            log.warning(
                "%d job(s) claimed for this manager in a call whose answer was "
                "lost went back to the queue, never started: %s",
                len(back),
                ", ".join(back),
            )
        return len(back)
