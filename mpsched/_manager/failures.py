"""RecentFailures: the latest jobs that failed, with why, for the dashboard.

The manager never unpickles an outcome, but a failed job's outcome carries its traceback as
text, formatted by the worker; a job lost with its worker carries the manager's own error
message. The service notes each failure here (work on the failure path only: a job that
succeeds costs nothing), and the HTTP status server reads the latest.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque
from typing import NamedTuple

from mpsched._core.job import Job, JobRecord, JobState, Outcome, OutcomeKind
from mpsched._core.retrying import error_line as traceback_error_line

KEEP = 20  # failures remembered
MAX_TRACEBACK = 16 * 1024  # characters of a traceback kept: its end, where the error is


class Failure(NamedTuple):
    """One failed job as the dashboard shows it."""

    job_id: str
    name: str
    worker_id: str | None
    attempt: int
    failed_wall: float  # epoch seconds
    error: str  # the error's type and message, one line
    traceback: str  # the worker's traceback ("" for a job lost with its worker)


class RecentFailures:
    """The latest :data:`KEEP` failures, newest last. Thread-safe."""

    def __init__(self, keep: int = KEEP) -> None:
        # Guards _failures; held to append or copy, nobody waits on it.
        self._lock = threading.Lock()
        self._failures: deque[Failure] = deque(maxlen=keep)

    def note(self, job: Job, outcome: Outcome, worker_id: str | None, message: str = "") -> None:
        """Remember that ``job`` failed with ``outcome``; ``message``: the manager's own
        words for an error it made itself (a lost worker, a timeout)."""
        traceback = outcome.traceback
        if len(traceback) > MAX_TRACEBACK:
            traceback = "...\n" + traceback[-MAX_TRACEBACK:]
        error = message or _last_line(traceback) or outcome.error_kind or "failed"
        failure = Failure(
            job.job_id, job.name, worker_id, job.attempt, time.time(), error, traceback
        )
        with self._lock:
            self._failures.append(failure)

    def latest(self) -> list[Failure]:
        """The failures remembered, newest first."""
        with self._lock:
            return list(reversed(self._failures))


def _last_line(traceback: str) -> str:
    """The line of a formatted traceback that names the error (``ValueError: boom``)."""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def described(record: JobRecord) -> JobRecord:
    """``record`` as a client gets it: without its outcome, and if it failed with its
    error in one line."""
    if record.outcome is None:
        return record
    if record.state is not JobState.FAILED:
        return record._replace(outcome=None)
    try:
        outcome = Outcome._make(pickle.loads(record.outcome))  # plain data: journal.encode
    except Exception:  # not an outcome this manager wrote: say nothing of it
        return record._replace(outcome=None)
    return record._replace(outcome=None, error=error_line(outcome))


# The ends the manager (not the job) decides: their payload is its own error, pickled
# without user code, which it may read back.
_VERDICTS = {
    str(k)
    for k in (
        OutcomeKind.WORKER_CRASHED,
        OutcomeKind.JOB_TIMEOUT,
        OutcomeKind.SHUTDOWN,
        OutcomeKind.OUTCOME_LOST,
        OutcomeKind.OUTCOME_NOT_KEPT,
    )
}


def error_line(outcome: Outcome) -> str:
    """A failed job's error in one line: the last line of its worker's traceback, or the
    manager's own error for an end it decided (a lost worker, a timeout)."""
    if outcome.traceback.strip():  # its last line, before the notes of earlier attempts
        return traceback_error_line(outcome.traceback)
    if str(outcome.error_kind) in _VERDICTS and outcome.payload:
        try:
            error = pickle.loads(outcome.payload)
        except Exception:
            return str(outcome.error_kind)
        return f"{type(error).__name__}: {error}"
    return str(outcome.error_kind) or "failed"
