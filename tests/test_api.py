"""The public surface changes only on purpose."""

from __future__ import annotations

import multiprocessing
import pickle
import queue

import pytest

import mpsched


def test_public_names_are_pinned():
    assert mpsched.__all__ == [
        "AddressError",
        "AuthenticationError",
        "Client",
        "ExtraMissingError",
        "InvalidJobError",
        "JobError",
        "JobFuture",
        "JobInfo",
        "JobNotFoundError",
        "JobPicklingError",
        "JobTimeoutError",
        "JobUnpicklingError",
        "ManagerConnectionLostError",
        "ManagerUnreachableError",
        "MpschedError",
        "Order",
        "Priority",
        "QueueFullError",
        "QueueStats",
        "RemoteTraceback",
        "ResultPicklingError",
        "ResultUnpicklingError",
        "Schedule",
        "ScheduleCounters",
        "ScheduleInfo",
        "ScheduleNotFoundError",
        "Scheduler",
        "SchedulerShutdownError",
        "Stats",
        "StoreError",
        "StoreFullError",
        "StoreLockedError",
        "TlsError",
        "VersionMismatchError",
        "WorkerCrashedError",
        "WorkerStatus",
        "connect",
    ]
    assert all(hasattr(mpsched, name) for name in mpsched.__all__)


def test_errors_derive_from_the_base_and_the_matching_stdlib_type():
    pairs = {
        mpsched.InvalidJobError: ValueError,
        mpsched.SchedulerShutdownError: RuntimeError,
        mpsched.QueueFullError: queue.Full,
        mpsched.JobPicklingError: pickle.PicklingError,
        mpsched.JobUnpicklingError: pickle.UnpicklingError,
        mpsched.ResultPicklingError: pickle.PicklingError,
        mpsched.ResultUnpicklingError: pickle.UnpicklingError,
        mpsched.WorkerCrashedError: ChildProcessError,
        mpsched.JobTimeoutError: TimeoutError,
        mpsched.AuthenticationError: multiprocessing.AuthenticationError,
        mpsched.ManagerUnreachableError: ConnectionError,
        mpsched.ManagerConnectionLostError: ConnectionError,
        mpsched.AddressError: ValueError,
        mpsched.TlsError: mpsched.AuthenticationError,
    }
    for error, stdlib in pairs.items():
        assert issubclass(error, mpsched.MpschedError) and issubclass(error, stdlib), error


def test_a_bad_address_raises_the_exported_error_at_the_call_site():
    # The class a user can name (mpsched.AddressError), not one of a private module only.
    with pytest.raises(mpsched.AddressError, match="unix:") as caught:
        mpsched.connect("neither-a-path-nor-host-port")
    assert type(caught.value).__module__ == "mpsched._errors"


def test_errors_with_facts_survive_pickling():
    errors = [
        mpsched.QueueFullError(3, 0.5),
        mpsched.WorkerCrashedError("job-1", "w1", -9),
        mpsched.JobTimeoutError("job-2", 1.5),
        mpsched.VersionMismatchError("worker w1", ("3.11", "3.1.1"), ("3.12", "3.0.0")),
        mpsched.ManagerUnreachableError("db1:7000", "nothing is listening there"),
        mpsched.ManagerConnectionLostError("db1:7000", "EOFError", "it reconnects by itself"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert "SIGKILL" in str(errors[1]) and "3.12" in str(errors[3])
