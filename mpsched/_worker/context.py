"""The running job's context: what ``current_job()`` returns in a worker, and the progress a
job reports, coalesced on its way to the manager.

The worker notes the assignment it enters (``entered``) and clears it after (``left``):
two stores of a module global per job. The context itself is built only when a job asks
for it, so a job that never does pays nothing more.

Progress never costs a round trip per call: ``set_progress`` checks and encodes the value,
keeps it as its job's latest, and a sender thread of the worker's (started at the first
call) sends the latest value of each job at most once per ``PROGRESS_LINGER`` seconds,
on a connection of its own. Values set meanwhile replace each other: the latest wins. A
value set just before its job ends may not be sent: progress is of jobs that run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from mpsched._core.job import Assignment
from mpsched._core.progress import encode_progress
from mpsched._core.recurring import schedule_of

log = logging.getLogger("mpsched.worker")

PROGRESS_LINGER = 0.05  # seconds between two sends of progress by one worker, at least

# (lease id, job id, JSON text): one job's latest progress, as it goes to the manager.
ProgressUpdate = tuple[int, str, str]


class ProgressSender:
    """The latest progress of each job this worker ran, and the thread that sends it.

    Args:
        send: sends a batch of updates to the manager (one call); runs in the sender
            thread, which must own its connection.
        linger: seconds the thread waits after a send before the next one.
    """

    def __init__(
        self, send: Callable[[list[ProgressUpdate]], None], linger: float = PROGRESS_LINGER
    ) -> None:
        self._send = send
        self._linger = linger
        # Guards _latest, _idle and _thread. The sender thread waits on _changed, untimed,
        # while nothing is to be sent (_idle): put() then notifies it. After each send it
        # sleeps ``linger`` without the lock, so the values set meanwhile are coalesced.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._latest: dict[int, tuple[str, str]] = {}  # lease id -> (job id, JSON)
        self._idle = False
        self._thread: threading.Thread | None = None

    def put(self, lease_id: int, job_id: str, text: str) -> None:
        """Make ``text`` the latest progress of the job under ``lease_id``."""
        with self._lock:
            self._latest[lease_id] = (job_id, text)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="mpsched-progress"
                )
                self._thread.start()
            elif self._idle:
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._latest:
                    self._idle = True
                    self._changed.wait()
                self._idle = False
                batch = [
                    (lease_id, job_id, text) for lease_id, (job_id, text) in self._latest.items()
                ]
                self._latest.clear()
            try:
                self._send(batch)
            except Exception as exc:  # the job goes on; its next value may get through
                log.warning(
                    "could not send the progress of %d job(s) (%s: %s)",
                    len(batch),
                    type(exc).__name__,
                    exc,
                )
            time.sleep(self._linger)


# This worker's way to its manager, bound by the worker loop at each join (a remote worker
# joins again after its manager comes back), the sender of its jobs' progress (made at
# the first report), and the job it runs now. The worker's main thread writes
# ``_running``; a job's own threads may read it while the job runs.
_send: Callable[[list[ProgressUpdate]], None] | None = None
_budget: Callable[[str], int] | None = None
_sender: ProgressSender | None = None
_running: tuple[Assignment, float] | None = None  # the assignment, when it was due here


def bind(
    send: Callable[[list[ProgressUpdate]], None] | None, budget: Callable[[str], int] | None
) -> None:
    """How this worker's jobs reach the manager: ``send`` takes a batch of progress
    updates, in the sender thread; ``budget`` asks for a job's retry budget
    (JobContext.max_retries), in the job's thread. None: they go nowhere."""
    global _send, _budget
    _send, _budget = send, budget


def _send_progress(updates: list[ProgressUpdate]) -> None:
    send = _send
    if send is not None:
        send(updates)


def _progress_sender() -> ProgressSender:
    global _sender
    sender = _sender
    if sender is None:  # only a job's threads get here: a race makes one sender too many
        sender = _sender = ProgressSender(_send_progress)
    return sender


def entered(assignment: Assignment, due: float) -> None:
    """The worker enters ``assignment``'s job, due at ``due`` on this process's monotonic
    clock (the manager's instant, or the delay from receipt the worker waited)."""
    global _running
    _running = (assignment, due)


def left() -> None:
    """The job the worker ran has returned."""
    global _running
    _running = None


def current_job() -> JobContext | None:
    """The context of the job running in this worker process; None outside a job (in a
    client, a manager, or a worker between jobs).

    Threads a job starts see it too, while the job runs.
    """
    running = _running
    if running is None:
        return None
    return JobContext(*running)


class JobContext:
    """The job that runs in this worker: its id, its attempt, when it was due, its schedule,
    and a way to report its progress (``mpsched.current_job()`` returns it)."""

    __slots__ = ("_assignment", "_due", "_max_retries")

    def __init__(self, assignment: Assignment, due: float) -> None:
        self._assignment = assignment
        self._due = due
        self._max_retries: int | None = None

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self._assignment.lease.job_id

    @property
    def attempt(self) -> int:
        """Which run of the job this is: 1 for its first, 2 when it runs again (after its
        worker died under it), and so on."""
        return self._assignment.lease.attempt

    @property
    def max_retries(self) -> int:
        """How many times the job may run again after this run fails (0: never). Asked
        of the manager at the first read, in one call."""
        if self._max_retries is None:
            self._max_retries = 0 if _budget is None else _budget(self.job_id)
        return self._max_retries

    @property
    def due(self) -> datetime:
        """When the job was due, an aware datetime in UTC. A schedule's run is due at its
        slot; another job at the time its manager measured, give or take the clocks'
        offset (microseconds for a local worker)."""
        return datetime.fromtimestamp(due_wall(self._assignment, self._due), timezone.utc)

    @property
    def schedule_id(self) -> str | None:
        """The id of the schedule this job is a run of; None for a job of its own."""
        return schedule_of(self.job_id)

    def set_progress(self, value: float | dict[str, Any]) -> None:
        """Report the job's progress: a number in [0, 1], or a short dict that JSON can
        encode (at most 4 KiB encoded). Returns at once: the latest value reaches the
        manager within ~50 ms, and shows in ``JobInfo.progress``, ``python -m mpsched
        jobs``, ``/api/jobs/<id>`` and the status page.

        Raises:
            ConfigError (a ValueError): any other value: NaN, a bool, a number out of
                [0, 1], a dict JSON cannot encode or longer than 4 KiB encoded.
        """
        text = encode_progress(value)
        if _send is not None:
            lease = self._assignment.lease
            _progress_sender().put(lease.lease_id, lease.job_id, text)

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id!r}, attempt={self.attempt}, "
            f"due={self.due.isoformat()!r}, schedule_id={self.schedule_id!r})"
        )


def due_wall(assignment: Assignment, due: float) -> float:
    """When ``assignment``'s job was due, in epoch seconds: exactly, for a schedule's run
    (its id names its slot) and a job asked for ``at=``; else ``due`` (this process's
    monotonic clock) through this process's clocks."""
    if assignment.at is not None:
        return assignment.at
    job_id = assignment.lease.job_id
    if schedule_of(job_id) is not None:
        slot = job_id.rpartition("@")[2]
        try:
            return datetime.fromisoformat(slot.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return time.time() - (time.monotonic() - due)
