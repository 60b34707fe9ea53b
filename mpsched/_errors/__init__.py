"""The errors mpsched raises.

Every error derives from :class:`MpschedError` and, where one fits, from the standard
exception a caller would already catch for the same situation::

    MpschedError
     ├── InvalidJobError(ValueError)            bad due time, delay or priority at the call site
     │    └── PayloadTooLargeError               a job's pickle is larger than its store takes
     ├── ConfigError(ValueError)                an option mpsched does not take: an unknown
     │                                          word (durability, overlap, state) or a bound
     ├── AddressError(ValueError)               an address neither ``unix:PATH`` nor HOST:PORT
     ├── SchedulerShutdownError(RuntimeError)   submit after shutdown, manager gone
     │    └── WorkerDismissedError              (a remote worker's own: its pool drains, exits)
     ├── NothingToRunError(RuntimeError)        run_forever() with no schedule and no job
     ├── QueueFullError(queue.Full)             bounded queue had no room before the timeout
     ├── JobPicklingError(pickle.PicklingError) the callable or its arguments did not pickle
     ├── JobUnpicklingError(pickle.UnpicklingError)   ... or did not unpickle in the worker
     ├── ResultPicklingError(pickle.PicklingError)    the result did not pickle in the worker
     ├── ResultUnpicklingError(pickle.UnpicklingError) ... or did not unpickle in the client
     ├── JobError                               a job raised an exception that cannot travel
     │    └── DependencyFailedError             a job's parent failed or was cancelled
     ├── WorkerCrashedError(ChildProcessError)  the worker running a job died
     ├── JobTimeoutError(TimeoutError)          the job ran past its timeout and was killed
     ├── AuthenticationError(multiprocessing.AuthenticationError)   wrong or unsafe authkey
     │    ├── RuntimeDirError(PermissionError)  the local manager's directory is not this user's
     │    └── TlsError                          TLS set up wrongly, or its handshake failed
     ├── ManagerUnreachableError(ConnectionError)   no mpsched manager answers at an address
     │    ├── ManagerBusyError                  one does, but dropped every handshake tried
     │    └── ManagerConnectionLostError(SchedulerShutdownError)   a client lost its manager
     ├── JobNotFoundError(KeyError)             no job with that id (never, or forgotten)
     ├── ScheduleNotFoundError(KeyError)        no schedule with that id (or cancelled)
     ├── ExtraMissingError(ImportError)         a feature needs an optional extra not installed
     ├── VersionMismatchError                   peer runs another Python or cloudpickle
     ├── WorkerRetiredError                     (a remote worker's own: declared gone, join again)
     └── StoreError(OSError)                    the job store cannot be opened, read or written
          ├── StoreLockedError                  another manager holds the store's lock file
          ├── StoreFullError                    the disk or the database is full (SQLITE_FULL)
          └── StoreUnavailableError(ConnectionError)   a Redis store does not answer now
               └── StoreInDoubtError             ... nor whether it made the change asked

A job's own exception reaches ``Future.exception()`` as itself, with the worker's formatted
traceback chained as ``__cause__`` (a :class:`RemoteTraceback`).

The errors live by family, :mod:`mpsched._errors.base` (the base, and using mpsched wrongly
or at the wrong time), ``jobs``, ``connection`` and ``store``; every one is importable from
here, and its ``__module__`` says ``mpsched._errors``, as its tracebacks and pickles do.

May import nothing of mpsched: everything else imports it.
"""

from __future__ import annotations

from mpsched._errors.base import (
    ConfigError,
    ExtraMissingError,
    MpschedError,
    NothingToRunError,
    QueueFullError,
    SchedulerShutdownError,
    WorkerDismissedError,
)
from mpsched._errors.connection import (
    AddressError,
    AuthenticationError,
    ManagerBusyError,
    ManagerConnectionLostError,
    ManagerUnreachableError,
    RuntimeDirError,
    TlsError,
    VersionMismatchError,
    WorkerRetiredError,
)
from mpsched._errors.jobs import (
    DependencyFailedError,
    InvalidJobError,
    JobError,
    JobNotFoundError,
    JobPicklingError,
    JobTimeoutError,
    JobUnpicklingError,
    PayloadTooLargeError,
    RemoteTraceback,
    ResultPicklingError,
    ResultUnpicklingError,
    ScheduleNotFoundError,
    WorkerCrashedError,
)
from mpsched._errors.store import (
    StoreError,
    StoreFullError,
    StoreInDoubtError,
    StoreLockedError,
    StoreUnavailableError,
)

__all__ = [
    "AddressError",
    "AuthenticationError",
    "ConfigError",
    "DependencyFailedError",
    "ExtraMissingError",
    "InvalidJobError",
    "JobError",
    "JobNotFoundError",
    "JobPicklingError",
    "JobTimeoutError",
    "JobUnpicklingError",
    "ManagerBusyError",
    "ManagerConnectionLostError",
    "ManagerUnreachableError",
    "MpschedError",
    "NothingToRunError",
    "PayloadTooLargeError",
    "QueueFullError",
    "RemoteTraceback",
    "ResultPicklingError",
    "ResultUnpicklingError",
    "RuntimeDirError",
    "ScheduleNotFoundError",
    "SchedulerShutdownError",
    "StoreError",
    "StoreFullError",
    "StoreInDoubtError",
    "StoreLockedError",
    "StoreUnavailableError",
    "TlsError",
    "VersionMismatchError",
    "WorkerCrashedError",
    "WorkerDismissedError",
    "WorkerRetiredError",
]

# Pickles and tracebacks name each error by the module users import it from.
for _error in list(globals().values()):
    if isinstance(_error, type) and _error.__module__.startswith(f"{__name__}."):
        _error.__module__ = __name__
del _error
