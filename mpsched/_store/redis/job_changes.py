"""A Redis store's changes to jobs besides submits and claims: jobs that wait for their
parents (after.lua), ended jobs put back in the queue (requeue.lua), and the progress of
running ones (progress.lua)."""

from __future__ import annotations

from collections.abc import Sequence

from mpsched._core.job import After
from mpsched._errors import JobNotFoundError, StoreError
from mpsched._store.redis.records import NewJob
from mpsched._store.redis.scripts import Scripts
from mpsched._store.redis.session import Session


class JobChanges:
    """Submits of jobs waiting for parents, requeues of ended jobs, progress of running ones."""

    def __init__(self, session: Session, scripts: Scripts) -> None:
        self._session = session
        self._scripts = scripts

    def submit_after(self, jobs: Sequence[NewJob], afters: Sequence[After], owner: str) -> None:
        """Add jobs that wait for their parents (``afters``, one each), all or none: each
        becomes due once its last parent ended (see after.lua).

        Raises:
            JobNotFoundError: a parent the store does not know; nothing was added.
            InvalidJobError: a job id the store holds already.
            StoreUnavailableError, StoreError: as ``RedisStore.submit_jobs``.
        """
        try:
            with self._session.errors():
                self._scripts.submit_after(jobs, afters, owner)
        except StoreError as exc:
            if "NOTFOUND " in str(exc):
                parent = str(exc).split("NOTFOUND ", 1)[1].split()[0].rstrip(")'\"")
                raise JobNotFoundError(parent) from None
            raise

    def requeue_ended(self, me: str, job_id: str, client_id: str) -> int | str:
        """Put a failed or cancelled job back in the queue, due now (requeue.lua): 1, or 2
        when it became the head; else the word that says why not."""
        with self._session.errors():
            return self._scripts.requeue(me, job_id, client_id)

    def set_progress(self, updates: Sequence[tuple[str, str, str]]) -> int:
        """Record the latest progress of running jobs: (job id, its lease's token, JSON
        text) each; an update of a job that no longer runs under that lease is dropped.
        Returns how many were recorded."""
        with self._session.errors():
            return self._scripts.progress(updates)
