"""The job model: priorities, the ordering keys, and the records that cross processes.

Everything here is plain data, picklable with the standard pickler, so the manager can store
and forward jobs without importing user code: the callable and its arguments travel as an
opaque cloudpickled ``payload``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from mpsched._errors import InvalidJobError


class Priority(enum.Enum):
    """How urgent a job is among jobs due at the same time.

    Each member carries an explicit ``level`` (lower runs first). The level is written
    here, never derived from declaration order, so reordering members changes nothing.
    """

    HIGH = 1
    MEDIUM = 2
    LOW = 3

    @property
    def level(self) -> int:
        """1 for HIGH, 2 for MEDIUM, 3 for LOW: lower levels run first."""
        return int(self.value)

    @classmethod
    def coerce(cls, priority: Priority | str) -> Priority:
        """Return ``priority`` as a member; names are accepted in any case (``"high"``).

        Raises:
            InvalidJobError: ``priority`` is neither a member nor one of their names.
        """
        if isinstance(priority, Priority):
            return priority
        if isinstance(priority, str):
            try:
                return cls[priority.strip().upper()]
            except KeyError:
                pass
        names = ", ".join(p.name.lower() for p in cls)
        raise InvalidJobError(f"unknown priority {priority!r}: use Priority or one of {names}")


class Order(str, enum.Enum):
    """Which key decides among jobs that are already due."""

    TIME = "time"  # due time, then priority, then submission order (the seed's order)
    PRIORITY = "priority"  # priority, then due time, then submission order

    @classmethod
    def coerce(cls, order: Order | str) -> Order:
        try:
            return cls(order)
        except ValueError:
            raise InvalidJobError(f"unknown order {order!r}: use 'time' or 'priority'") from None


class JobRequest(NamedTuple):
    """What a client sends to submit one job. Exactly one of ``delay`` and ``at`` is set."""

    job_id: str
    client_id: str
    payload: bytes  # cloudpickled (fn, args, kwargs); the manager never unpickles it
    priority: int  # Priority.level
    delay: float | None  # seconds from the manager's receipt, >= 0
    at: float | None  # wall-clock epoch seconds
    timeout: float | None = None  # seconds a worker may run it before it is killed
    retries: int = 0  # times it is run again after its worker died under it


@dataclass(eq=False, slots=True)
class Job:
    """A job inside the manager. Heap entries hold it; keys never compare it."""

    job_id: str
    client_id: str
    payload: bytes
    priority: int
    due: float  # the manager's monotonic clock
    seq: int  # manager-wide submission counter: the FIFO tie-break
    timeout: float | None = None
    retries: int = 0
    attempt: int = 0  # times handed to a worker that received it
    cancelled: bool = field(default=False)

    def time_key(self) -> tuple[float, int, int]:
        """The heap key of ``order="time"``: due, then priority level, then seq."""
        return (self.due, self.priority, self.seq)

    def priority_key(self) -> tuple[int, float, int]:
        """The key among due jobs of ``order="priority"``: level, then due, then seq."""
        return (self.priority, self.due, self.seq)


class Lease(NamedTuple):
    """A worker's claim on one in-flight job; completing it names the lease."""

    lease_id: int
    job_id: str
    worker_id: str
    attempt: int


class Assignment(NamedTuple):
    """What ``take()`` hands a worker: the job's payload under a lease."""

    lease: Lease
    payload: bytes
    due: float  # the manager's monotonic clock, for the worker's lateness stamp
    timeout: float | None = None  # enforced by the manager, not the worker


class Outcome(NamedTuple):
    """How one job ended, as a worker reports it and a client receives it.

    ``ok`` means ``payload`` is the cloudpickled return value; otherwise it is the
    cloudpickled exception (or empty when even that failed) and ``traceback`` is the
    worker's formatted traceback. ``started`` is the worker's monotonic clock at the
    moment the callable was entered; ``None`` when it never was.
    """

    job_id: str
    ok: bool
    payload: bytes
    traceback: str
    started: float | None
    error_kind: str = ""  # "" for a job's own exception; else names the failed step
