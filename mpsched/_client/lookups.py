"""What a client asks its manager of jobs by id, of all jobs, and of the whole."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._core.job import JobInfo, JobRecord, JobState, JobStateLike, Priority
from mpsched._core.progress import decode_progress
from mpsched._errors import ConfigError, InvalidJobError, JobNotFoundError
from mpsched._protocol.records import Stats


class Lookups:
    """The lookups of one client (``job``, ``jobs``, ``job_info``, ``requeue``, ``cancel``,
    ``stats``): each first sends what the client submitted before it."""

    def __init__(self, core: ClientCore) -> None:
        self._core = core

    def _flush(self) -> None:
        if self._core.outbox is not None:
            self._core.outbox.flush()

    def stats(self) -> Stats:
        """As Client.stats."""
        self._flush()
        return self._core.link.ask(lambda service: service.stats())

    def job(self, job_id: str) -> JobFuture[Any]:
        """As Client.job."""
        _check_id(job_id)
        self._flush()  # a job this client just submitted is known there
        return self._core.watch(job_id)

    def jobs(self, state: JobStateLike | None, limit: int | None) -> list[JobInfo]:
        """As Client.jobs."""
        word = None if state is None else str(JobState.coerce(state, "state"))
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ConfigError("limit", limit, "a positive int")
        self._flush()
        records = self._core.link.ask(lambda service: service.jobs(word, limit))
        return [_job_info(r) for r in records]

    def job_info(self, job_id: str) -> JobInfo:
        """As Client.job_info."""
        _check_id(job_id)
        self._core.wait_sent(job_id)  # a job of this client's own is known there
        record = self._core.link.ask(lambda service: service.job(job_id))
        if record is None:
            raise JobNotFoundError(job_id)
        return _job_info(record)

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """As Client.requeue."""
        _check_id(job_id)
        self._flush()  # a job this client just cancelled is known there
        return self._core.requeue(job_id)

    def cancel(self, job_id: str) -> bool:
        """As Client.cancel."""
        own = self._core.future(job_id)
        if own is not None:
            return own.cancel()
        self._flush()
        return self._core.link.ask(lambda service: service.cancel(job_id, self._core.client_id))


def _check_id(job_id: object) -> None:
    if not isinstance(job_id, str) or not job_id:
        raise InvalidJobError(f"a job id is a non-empty string, not {job_id!r}")


def _job_info(record: JobRecord) -> JobInfo:
    return JobInfo(
        job_id=record.job_id,
        name=record.name,
        state=record.state.value,
        due=datetime.fromtimestamp(record.due_wall, timezone.utc),
        priority=Priority(record.priority),
        attempts=record.attempt,
        worker=record.worker_id,
        key=record.key,
        error=record.error,
        progress=decode_progress(record.progress),
        queue=record.queue,
        limit=record.limit,
        waiting_for=record.waiting_for,
    )
