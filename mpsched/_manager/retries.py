"""What the manager keeps of a retried job's failed attempts, and how they reach its final
outcome: the last error's one line (``JobInfo.error``) and a note per attempt, which the
client adds to the final exception (mpsched._core.retrying)."""

from __future__ import annotations

from mpsched._core.job import Job, Outcome, OutcomeKind
from mpsched._core.retrying import attempt_note, with_notes
from mpsched._errors import WorkerCrashedError


def note_attempt(job: Job, line: str, wall: float | None = None) -> None:
    """Keep a failed attempt of ``job`` (its ``attempt``-th run), which runs again; called
    before the job is back where another thread may take it."""
    job.error = line
    note = attempt_note(job.attempt, line, wall)
    if job.notes is None:
        job.notes = [note]
    else:
        job.notes.append(note)


def note_crash(job: Job, worker_id: str, exitcode: int | None) -> None:
    """Keep an attempt whose worker died under it, as :func:`note_attempt`."""
    error = WorkerCrashedError(job.job_id, worker_id, exitcode)
    note_attempt(job, f"WorkerCrashedError: {error}")


def final_outcome(job: Job, outcome: Outcome) -> Outcome:
    """``outcome`` as the job's clients get it when it ends for good: the job's own
    exception (never a retry's kind), with its earlier attempts as notes."""
    if outcome.ok:
        return outcome
    kind = outcome.error_kind
    if kind.startswith(OutcomeKind.RETRYABLE) or kind.startswith(OutcomeKind.RETRY_LATER):
        kind = OutcomeKind.RAISED
    if not job.notes and kind == outcome.error_kind:
        return outcome
    return outcome._replace(
        error_kind=kind, traceback=with_notes(outcome.traceback, job.notes or [])
    )
