"""The errors of one job: described wrongly, not pickled, raised, crashed, late or unknown."""

from __future__ import annotations

import pickle

from mpsched._errors.base import MpschedError


class InvalidJobError(MpschedError, ValueError):
    """A job was described wrongly: a NaN, infinite or overflowing time, an unknown priority."""


class PayloadTooLargeError(InvalidJobError):
    """A job's pickled callable and arguments are larger than its store can hold (a Redis
    string: 512 MiB, or the server's ``proto-max-bulk-len``)."""

    def __init__(self, size: int, limit: int, where: str) -> None:
        self.size = size
        self.limit = limit
        self.where = where
        super().__init__(
            f"the job's pickle is {size} bytes, more than {where} takes ({limit} bytes)"
        )

    def __reduce__(self) -> tuple[type[PayloadTooLargeError], tuple[int, int, str]]:
        return (type(self), (self.size, self.limit, self.where))


class JobPicklingError(MpschedError, pickle.PicklingError):
    """The callable or its arguments could not be pickled at the call site."""


class JobUnpicklingError(MpschedError, pickle.UnpicklingError):
    """The worker could not unpickle the job's callable or arguments."""


class ResultPicklingError(MpschedError, pickle.PicklingError):
    """The job ran, but the worker could not pickle its result."""


class ResultUnpicklingError(MpschedError, pickle.UnpicklingError):
    """The job ran, but the submitting client could not unpickle its result."""


class JobError(MpschedError):
    """A job raised an exception that could not be sent back as itself.

    The message names the original type and text; the remote traceback is the ``__cause__``.
    """


class DependencyFailedError(JobError):
    """A job ran after others (``after=``, ``ResultOf``), and one of them failed or was
    cancelled: the job never ran. ``parent_id`` names that parent, ``outcome`` how it
    ended (the name of its error, or "cancelled")."""

    def __init__(self, job_id: str, parent_id: str, outcome: str) -> None:
        self.job_id = job_id
        self.parent_id = parent_id
        self.outcome = outcome
        how = "was cancelled" if outcome == "cancelled" else "failed"
        if outcome not in ("cancelled", "failed", ""):
            how += f" ({outcome})"
        super().__init__(f"job {job_id} did not run: its parent job {parent_id} {how}")

    def __reduce__(self) -> tuple[type[DependencyFailedError], tuple[str, str, str]]:
        return (type(self), (self.job_id, self.parent_id, self.outcome))


class RemoteTraceback(Exception):
    """Carries the worker's formatted traceback; set as ``__cause__`` of a job's exception.

    ``traceback`` is the text as the worker formatted it; ``tb`` (and ``str()``) the same
    between triple quotes, as ``concurrent.futures`` shows a worker's traceback.
    """

    def __init__(self, traceback: str) -> None:
        self.traceback = traceback
        self.tb = f'\n"""\n{traceback}"""'
        super().__init__(traceback)

    def __str__(self) -> str:
        return self.tb


class WorkerCrashedError(MpschedError, ChildProcessError):
    """The worker process running a job died before reporting its outcome."""

    def __init__(self, job_id: str, worker_id: str, exitcode: int | None) -> None:
        self.job_id = job_id
        self.worker_id = worker_id
        self.exitcode = exitcode
        if exitcode is None:
            how = "went away"
        elif exitcode < 0:
            how = f"was killed by signal {_signal_name(-exitcode)}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"job {job_id}: worker {worker_id} {how} while running it")

    def __reduce__(self) -> tuple[type[WorkerCrashedError], tuple[str, str, int | None]]:
        return (type(self), (self.job_id, self.worker_id, self.exitcode))


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class JobTimeoutError(MpschedError, TimeoutError):
    """A job ran longer than its ``timeout``; its worker's process tree was killed."""

    def __init__(self, job_id: str, timeout: float) -> None:
        self.job_id = job_id
        self.timeout = timeout
        super().__init__(f"job {job_id} ran past its timeout of {timeout:g} s and was killed")

    def __reduce__(self) -> tuple[type[JobTimeoutError], tuple[str, float]]:
        return (type(self), (self.job_id, self.timeout))


class JobNotFoundError(MpschedError, KeyError):
    """The manager knows no job with this id: there never was one, or it ended and was
    forgotten (``result_ttl`` seconds later; without a store sooner when more than
    100,000 jobs ended since)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return (
            f"no job {self.job_id}: unknown, or ended and forgotten (ended jobs are "
            f"kept for result_ttl; without a store, at most the 100,000 latest)"
        )

    def __reduce__(self) -> tuple[type[JobNotFoundError], tuple[str]]:
        return (type(self), (self.job_id,))


class ScheduleNotFoundError(MpschedError, KeyError):
    """The manager has no schedule with this id: it was cancelled (``cancelled`` says the
    manager still remembers that, as it does for ``result_ttl``), or it never knew it."""

    def __init__(self, schedule_id: str, cancelled: bool = False) -> None:
        self.schedule_id = schedule_id
        self.cancelled = cancelled
        super().__init__(schedule_id)

    def __str__(self) -> str:
        if self.cancelled:
            return f"schedule {self.schedule_id!r} was cancelled"
        return f"no schedule {self.schedule_id!r}: never added, or cancelled and forgotten"

    def __reduce__(self) -> tuple[type[ScheduleNotFoundError], tuple[str, bool]]:
        return (type(self), (self.schedule_id, self.cancelled))
