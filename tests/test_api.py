"""The public surface changes only on purpose."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import re
from pathlib import Path

import pytest

import mpsched


def test_public_names_are_pinned():
    assert mpsched.__all__ == [
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
    assert all(hasattr(mpsched, name) for name in mpsched.__all__)


def test_errors_derive_from_the_base_and_the_matching_stdlib_type():
    pairs = {
        mpsched.InvalidJobError: ValueError,
        mpsched.SchedulerShutdownError: RuntimeError,
        mpsched.NothingToRunError: RuntimeError,
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
        mpsched.ManagerBusyError: mpsched.ManagerUnreachableError,
        mpsched.StoreUnavailableError: ConnectionError,
        mpsched.StoreInDoubtError: mpsched.StoreUnavailableError,
        mpsched.PayloadTooLargeError: ValueError,
        mpsched.AddressError: ValueError,
        mpsched.ConfigError: ValueError,
        mpsched.TlsError: mpsched.AuthenticationError,
        mpsched.RuntimeDirError: PermissionError,
        mpsched.DependencyFailedError: mpsched.JobError,
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
        mpsched.ManagerBusyError("db1:7000", "it closed every handshake tried for 10 s"),
        mpsched.PayloadTooLargeError(600 * 2**20, 512 * 2**20, "the Redis store"),
        mpsched.StoreUnavailableError("redis://db1:6379/0", "nothing is listening there"),
        mpsched.NothingToRunError(),
        mpsched.StoreInDoubtError("redis://db1:6379/0", "no answer in time"),
        mpsched.DependencyFailedError("job-3", "job-2", "ValueError: no"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert "SIGKILL" in str(errors[1]) and "3.12" in str(errors[3])


def test_every_error_is_exported_and_drawn_in_the_tree():
    from mpsched import _errors

    errors = {
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, mpsched.MpschedError)
    }
    # A remote worker's own (it joins again; its pool leaves): no user sees them.
    internal = {"WorkerRetiredError", "WorkerDismissedError"}
    assert errors - internal <= set(mpsched.__all__), errors - internal - set(mpsched.__all__)
    drawn = set(re.findall(r"[├└]── (\w+)", _errors.__doc__ or "")) | {"MpschedError"}
    assert errors == drawn, errors ^ drawn


@pytest.mark.parametrize(
    ("option", "word"),
    [
        (mpsched.Durability, "process"),
        (mpsched.Mode, "delay"),
        (mpsched.Overlap, "queue"),
        (mpsched.Catchup, "all"),
        (mpsched.OnError, "pause"),
        (mpsched.Order, "priority"),
        (mpsched.JobState, "done"),
    ],
)
def test_an_option_is_its_word_and_a_typo_is_a_config_error(option, word):
    member = option.coerce(word)
    assert member == word and str(member) == word and f"{member}" == word
    assert option.coerce(member) is member
    with pytest.raises(mpsched.ConfigError) as caught:
        option.coerce(word + "x")
    assert isinstance(caught.value, ValueError)
    assert repr(word + "x") in str(caught.value) and repr(word) in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.option, again.value, str(again)) == (
        caught.value.option,
        word + "x",
        str(caught.value),
    )


def test_a_config_typo_is_refused_at_the_call_site_before_anything_starts(tmp_path):
    with pytest.raises(mpsched.ConfigError, match=r"^durability must be 'sync' or 'process'"):
        mpsched.Scheduler(workers=1, durability="fast")  # type: ignore[arg-type]
    with pytest.raises(mpsched.ConfigError, match=r"^result_ttl"):
        mpsched.Scheduler(workers=1, store=tmp_path / "a.db", result_ttl=-1)
    assert not (tmp_path / "a.db").exists()


# ------------------------------------------------------------ the manager's remote surface


def _proxied() -> set[str]:
    """The service methods ServiceProxy calls (``self._call("name", ...)``)."""
    from mpsched._protocol import proxy

    return set(re.findall(r'_call\(\s*"(\w+)"', Path(proxy.__file__).read_text()))


def test_what_a_peer_may_call_is_declared_on_the_service_and_matches_the_proxy():
    from mpsched._manager.service import ManagerService
    from mpsched._protocol.proxy import remote_methods

    assert set(remote_methods(ManagerService)) == _proxied()
    assert "lose_worker" not in remote_methods(ManagerService)  # public, but not remote


def test_a_served_service_exposes_exactly_its_remote_methods():
    from mpsched._protocol import proxy

    class Served:
        @proxy.remote
        def stats(self) -> None: ...

        def stop(self) -> None: ...  # public, not marked: refused

    before = proxy._SERVED
    try:
        proxy.serve_object(Served())
        exposed = proxy.ServiceManager._registry["service"][1]  # type: ignore[attr-defined]
        assert tuple(exposed) == ("stats",)
    finally:
        if before is not None:
            proxy.serve_object(before)
        else:
            proxy.serve_nothing()


# Remote methods no test calls by name, and the end-to-end test that reaches each through
# the public API (the call is made in a client or worker process).
REACHED_THROUGH = {
    "cancel_many": "test_interrupt.py::test_ctrl_c_in_a_with_block_cancels_what_has_not_"
    "started_and_waits_for_what_runs",
    "close_client": "test_scheduler.py::test_shutdown_cancel_futures_cancels_pending_and_"
    "returns_promptly",
    "not_due": "test_interrupt.py::test_with_a_store_ctrl_c_leaves_the_jobs_due_later_in_it",
    "payload_options": "test_payloads.py::test_arguments_and_results_travel_through_shared_memory",
    "retry_budget": "test_job_context.py::test_a_job_reads_its_id_attempt_retry_budget_and_"
    "due_time",
    "schedule_preview": "test_schedule.py::test_cron_plans_in_its_zone_and_checks_at_the_call_site",
    "watch_many": "test_reconnect.py::test_with_a_store_outstanding_futures_resolve_after_"
    "the_restart",
}


def test_every_remote_method_is_called_by_a_test():
    from mpsched._manager.service import ManagerService
    from mpsched._protocol.proxy import remote_methods

    tests = Path(__file__).parent
    here = Path(__file__).resolve()
    sources = "\n".join(p.read_text() for p in tests.rglob("*.py") if p.resolve() != here)
    uncalled = {
        name for name in remote_methods(ManagerService) if not re.search(rf"\.{name}\(", sources)
    }
    assert uncalled == set(REACHED_THROUGH)
    for test in REACHED_THROUGH.values():
        path, _, name = test.partition("::")
        assert re.search(rf"^def {name}\(", (tests / path).read_text(), re.M), test
