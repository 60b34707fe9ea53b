"""mpsched: run Python jobs at a scheduled time, in priority order, on worker processes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpsched._core.job import JobInfo as JobInfo
from mpsched._core.job import JobState as JobState
from mpsched._core.job import Order as Order
from mpsched._core.job import Priority as Priority
from mpsched._core.job import QueueStats as QueueStats
from mpsched._core.options import Catchup as Catchup
from mpsched._core.options import Durability as Durability
from mpsched._core.options import Mode as Mode
from mpsched._core.options import OnError as OnError
from mpsched._core.options import Overlap as Overlap
from mpsched._core.recurring import ScheduleCounters as ScheduleCounters
from mpsched._core.recurring import ScheduleInfo as ScheduleInfo
from mpsched._core.result_of import ResultOf as ResultOf
from mpsched._core.retrying import RetryLater as RetryLater
from mpsched._core.retrying import RetryPolicy as RetryPolicy
from mpsched._errors import AddressError as AddressError
from mpsched._errors import AuthenticationError as AuthenticationError
from mpsched._errors import ConfigError as ConfigError
from mpsched._errors import DependencyFailedError as DependencyFailedError
from mpsched._errors import ExtraMissingError as ExtraMissingError
from mpsched._errors import InvalidJobError as InvalidJobError
from mpsched._errors import JobError as JobError
from mpsched._errors import JobNotFoundError as JobNotFoundError
from mpsched._errors import JobPicklingError as JobPicklingError
from mpsched._errors import JobTimeoutError as JobTimeoutError
from mpsched._errors import JobUnpicklingError as JobUnpicklingError
from mpsched._errors import ManagerBusyError as ManagerBusyError
from mpsched._errors import ManagerConnectionLostError as ManagerConnectionLostError
from mpsched._errors import ManagerUnreachableError as ManagerUnreachableError
from mpsched._errors import MpschedError as MpschedError
from mpsched._errors import NothingToRunError as NothingToRunError
from mpsched._errors import PayloadTooLargeError as PayloadTooLargeError
from mpsched._errors import QueueFullError as QueueFullError
from mpsched._errors import RemoteTraceback as RemoteTraceback
from mpsched._errors import ResultPicklingError as ResultPicklingError
from mpsched._errors import ResultUnpicklingError as ResultUnpicklingError
from mpsched._errors import RuntimeDirError as RuntimeDirError
from mpsched._errors import ScheduleNotFoundError as ScheduleNotFoundError
from mpsched._errors import SchedulerShutdownError as SchedulerShutdownError
from mpsched._errors import StoreError as StoreError
from mpsched._errors import StoreFullError as StoreFullError
from mpsched._errors import StoreInDoubtError as StoreInDoubtError
from mpsched._errors import StoreLockedError as StoreLockedError
from mpsched._errors import StoreUnavailableError as StoreUnavailableError
from mpsched._errors import TlsError as TlsError
from mpsched._errors import VersionMismatchError as VersionMismatchError
from mpsched._errors import WorkerCrashedError as WorkerCrashedError
from mpsched._protocol.records import (
    Stats as Stats,
)
from mpsched._protocol.records import (
    WorkerStatus as WorkerStatus,
)
from mpsched._worker.context import JobContext as JobContext
from mpsched._worker.context import current_job as current_job

__all__ = [
    "AddressError",
    "AuthenticationError",
    "Catchup",
    "Client",
    "ConfigError",
    "DependencyFailedError",
    "Durability",
    "ExtraMissingError",
    "InvalidJobError",
    "JobContext",
    "JobError",
    "JobFuture",
    "JobInfo",
    "JobNotFoundError",
    "JobPicklingError",
    "JobState",
    "JobTimeoutError",
    "JobUnpicklingError",
    "ManagerBusyError",
    "ManagerConnectionLostError",
    "ManagerUnreachableError",
    "Mode",
    "MpschedError",
    "NothingToRunError",
    "OnError",
    "Order",
    "Overlap",
    "PayloadTooLargeError",
    "Priority",
    "QueueFullError",
    "QueueStats",
    "RemoteTraceback",
    "ResultOf",
    "ResultPicklingError",
    "ResultUnpicklingError",
    "RetryLater",
    "RetryPolicy",
    "RuntimeDirError",
    "Schedule",
    "ScheduleCounters",
    "ScheduleInfo",
    "ScheduleNotFoundError",
    "Scheduler",
    "SchedulerShutdownError",
    "Stats",
    "StoreError",
    "StoreFullError",
    "StoreInDoubtError",
    "StoreLockedError",
    "StoreUnavailableError",
    "TlsError",
    "VersionMismatchError",
    "WorkerCrashedError",
    "WorkerStatus",
    "connect",
    "current_job",
]
__version__ = "0.1.0"

# The client side is imported at its first use: a manager, its workers and the forkserver
# that starts them import this package too, and never use it (~0.2 s of imports each).
_CLIENT = {
    "Client": "mpsched._client.client",
    "connect": "mpsched._client.client",
    "JobFuture": "mpsched._client.job_future",
    "Schedule": "mpsched._client.schedule_handle",
    "Scheduler": "mpsched._client.scheduler",
}

if TYPE_CHECKING:
    from mpsched._client.client import Client as Client
    from mpsched._client.client import connect as connect
    from mpsched._client.job_future import JobFuture as JobFuture
    from mpsched._client.schedule_handle import Schedule as Schedule
    from mpsched._client.scheduler import Scheduler as Scheduler


def __getattr__(name: str) -> Any:
    module = _CLIENT.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
