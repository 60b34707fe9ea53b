"""ManagerService in-process: what it does with workers' reports."""

from __future__ import annotations

import os
import threading
import time

import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Outcome, job_digest
from mpsched._core.queue import JobQueue
from mpsched._errors import WorkerRetiredError
from mpsched._manager.dispatch import EARLY_HANDOFF
from mpsched._manager.service import ManagerService
from mpsched._protocol.codec import (
    assignment_from_wire,
    report_to_wire,
)
from mpsched._protocol.records import (
    LeftBehind,
    Report,
    WorkerHello,
    WorkerLoad,
)
from mpsched._transport.sockets import describe_versions


def hello(
    worker_id: str, host: str, pid: int, *, remote: bool = True, local_token: str = ""
) -> WorkerHello:
    python, cp = describe_versions()
    return WorkerHello(worker_id, pid, host, python, cp, remote, local_token)


def started_here(service: ManagerService, worker_id: str) -> WorkerHello:
    """The hello of a worker this manager's supervisor started (it holds the token)."""
    return hello(
        worker_id, service.host, os.getpid(), remote=False, local_token=service.workers.local_token
    )


def run_one(service: ManagerService, worker_id: str) -> None:
    assert isinstance(service.queue, JobQueue)
    service.queue.submit(JobRequest(f"job-{worker_id}", "c", b"", 2, 0.0, None))
    [wire] = service.take(worker_id, None, 0)
    assignment = assignment_from_wire(wire)
    # A start stamp far from the manager's clock, as another machine's would be.
    outcome = Outcome(assignment.lease.job_id, True, b"", "", time.monotonic() - 1e6)
    service.finish(worker_id, [report_to_wire(Report(assignment.lease.lease_id, outcome))])


def test_only_workers_the_manager_started_count_in_lateness():
    # A host name proves nothing about clocks (two containers may share one): only the
    # manager's own workers report start stamps on its clock.
    service = ManagerService(JobQueue())
    service.hello(hello("far", "some-other-host", 4242))
    service.hello(hello("same-name", service.host, os.getpid()))
    service.hello(hello("no-token", service.host, os.getpid(), remote=False))
    service.hello(started_here(service, "near"))
    for worker_id in ("far", "same-name", "no-token"):
        run_one(service, worker_id)
    stats = service.stats().queue
    assert stats.completed == 3 and stats.lateness_samples == 0 and stats.started_early == 0
    run_one(service, "near")
    stats = service.stats().queue
    assert stats.completed == 4 and stats.lateness_samples == 1 and stats.started_early == 1


def test_take_reports_the_last_job_and_keeps_the_worker_bookkeeping():
    queue = JobQueue()
    service = ManagerService(queue)
    service.mailboxes.open("c")
    service.hello(hello("w", "some-other-host", 4242))
    for n in range(2):
        queue.submit(JobRequest(f"job-{n}", "c", b"", 2, 0.0, None))
    [first_wire] = service.take("w", None, 0)
    first = assignment_from_wire(first_wire)
    [worker] = service.stats().workers
    assert worker.current_job == "job-0" and worker.jobs_done == 0
    outcome = Outcome("job-0", True, b"result", "", time.monotonic())
    [second] = service.take("w", [report_to_wire(Report(first.lease.lease_id, outcome))], 0)
    assert assignment_from_wire(second).lease.job_id == "job-1"
    [worker] = service.stats().workers
    assert worker.current_job == "job-1" and worker.jobs_done == 1
    assert service.mailboxes.collect("c", 0) == [outcome]  # the client gets it as sent
    assert service.stats().queue.completed == 1


def test_only_a_worker_the_manager_started_is_handed_jobs_early():
    clock = FakeClock()  # time stands still
    queue = JobQueue(clock=clock)
    service = ManagerService(queue, clock=clock)
    service.hello(hello("far", "some-other-host", 4242))
    service.hello(hello("same-name", service.host, os.getpid()))
    service.hello(hello("no-token", service.host, os.getpid(), remote=False, local_token="guessed"))
    service.hello(started_here(service, "near"))
    soon = EARLY_HANDOFF / 2  # due within the early hand-off window
    for n in range(2):
        queue.submit(JobRequest(f"job-{n}", "c", b"", 2, soon + 60 * n, None))
    for worker_id in ("far", "same-name", "no-token"):
        assert service.take(worker_id, None, 0) == []
    [wire] = service.take("near", None, 0)
    early = assignment_from_wire(wire)
    assert early.lease.job_id == "job-0"
    # Its own worker shares the manager's clock: it gets the instant to wait for.
    assert early.due == clock.now() + soon and early.delay == pytest.approx(soon)


def test_only_a_worker_on_the_managers_machine_is_told_an_at_jobs_wall_clock_time():
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    service = ManagerService(queue, clock=clock)
    service.hello(hello("far", "some-other-host", 4242))
    service.hello(started_here(service, "near"))
    at = clock.wall()  # due now, by the wall clock too
    for n in range(2):
        queue.submit(JobRequest(f"job-{n}", "c", b"", 2, None, at))
    [far] = service.take("far", None, 0)
    [near] = service.take("near", None, 0)
    assert assignment_from_wire(far).at is None  # its wall clock is not ours
    assert assignment_from_wire(near).at == at


def test_a_worker_that_does_not_share_the_clock_gets_a_delay_and_no_instant():
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    service = ManagerService(queue, clock=clock)
    service.hello(hello("same-name", service.host, os.getpid()))
    queue.submit(JobRequest("job", "c", b"", 2, 5.0, None))
    clock.advance(5.0)
    [wire] = service.take("same-name", None, 0)
    assignment = assignment_from_wire(wire)
    assert assignment.lease.job_id == "job"
    assert assignment.due is None and assignment.delay == 0.0  # due now: run it at once


def test_a_worker_declared_gone_is_refused_and_its_late_report_changes_nothing():
    queue = JobQueue()
    service = ManagerService(queue, heartbeat_timeout=10)
    service.mailboxes.open("c")
    service.hello(hello("w", "some-other-host", 4242))
    queue.submit(JobRequest("job", "c", b"", 2, 0.0, None, retries=1))
    [wire] = service.take("w", None, 0)
    assignment = assignment_from_wire(wire)
    service.ack("w", assignment.lease.lease_id)
    assert service.lose_worker("w", exitcode=None) == 1  # requeued: it has a retry
    outcome = Outcome("job", True, b"", "", time.monotonic())
    report = report_to_wire(Report(assignment.lease.lease_id, outcome))
    for call in (
        lambda: service.take("w", [report], 0),
        lambda: service.take("w", None, 0),
        lambda: service.heartbeat("w", WorkerLoad(0.0, 0)),
    ):
        with pytest.raises(WorkerRetiredError, match="declared gone"):
            call()
    assert service.mailboxes.collect("c", 0) == []
    stats = service.stats().queue
    assert stats.completed == 0 and stats.retried == 1 and stats.pending["medium"] == 1


def test_the_manager_keeps_nothing_per_departed_worker():
    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    for n in range(50):
        service.hello(hello(f"w{n}", "some-other-host", 4242))
        service.lose_worker(f"w{n}", exitcode=0)
    kept = [
        name
        for part in (service, service.workers)
        for name, value in vars(part).items()
        if isinstance(value, (set, dict)) and len(value) >= 50
    ]
    assert not kept
    with pytest.raises(WorkerRetiredError, match="declared gone"):
        service.take("w7", None, 0)


def test_a_client_whose_result_connection_closes_leaves_no_mailbox():
    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    service.mailboxes.open("c")
    service.mailboxes.post("c", Outcome("j1", True, b"x" * 1000, "", None))

    def result_connection() -> None:  # one server thread serves one connection
        service.collect("c", 0)
        service.mailboxes.post("c", Outcome("j2", True, b"x" * 1000, "", None))
        service.connection_closed()

    thread = threading.Thread(target=result_connection)
    thread.start()
    thread.join(10)
    assert len(service.mailboxes) == 0
    service.mailboxes.post("c", Outcome("j3", True, b"", "", None))  # a late outcome
    assert len(service.mailboxes) == 0


def test_the_end_of_another_connection_leaves_the_mailbox_alone():
    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    service.mailboxes.open("c")
    thread = threading.Thread(target=service.connection_closed)  # e.g. a submit connection
    thread.start()
    thread.join(10)
    assert len(service.mailboxes) == 1


def _in_thread(action) -> threading.Thread:
    thread = threading.Thread(target=action)  # one server thread serves one connection
    thread.start()
    return thread


def test_a_mailbox_stays_while_any_connection_of_its_client_lives():
    from mpsched._protocol.records import (
        ClientHello,
    )

    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    python, cp = describe_versions()
    opened, collecting = threading.Event(), threading.Event()
    close_opener, close_collector = threading.Event(), threading.Event()

    def opener() -> None:
        service.open_client(ClientHello("c", python, cp))
        opened.set()
        close_opener.wait(10)
        service.connection_closed()

    def collector() -> None:
        service.collect("c", 0)
        collecting.set()
        close_collector.wait(10)
        service.connection_closed()

    threads = [_in_thread(opener)]
    assert opened.wait(10)
    threads.append(_in_thread(collector))
    assert collecting.wait(10)
    close_collector.set()
    threads[1].join(10)
    assert len(service.mailboxes) == 1  # the client's first connection is still there
    close_opener.set()
    threads[0].join(10)
    assert len(service.mailboxes) == 0


def test_a_client_that_dies_before_collecting_leaves_no_mailbox():
    from mpsched._protocol.records import (
        ClientHello,
    )

    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    python, cp = describe_versions()

    def opener_then_death() -> None:
        service.open_client(ClientHello("c", python, cp))
        service.connection_closed()

    _in_thread(opener_then_death).join(10)
    assert len(service.mailboxes) == 0


def test_a_manager_stopping_with_drain_workers_on_stop_knows_when_each_was_told():
    from mpsched._errors import WorkerDismissedError

    service = ManagerService(JobQueue(), heartbeat_timeout=10, drain_workers_on_stop=True)
    service.hello(hello("far", "some-other-host", 4242))
    service.stop()
    assert service.wait_workers_told(0) is False  # between two takes: not told yet
    with pytest.raises(WorkerDismissedError):
        service.take("far", None, 0)
    assert service.wait_workers_told(0) is True


def test_a_stopping_manager_dismisses_no_remote_worker_by_default():
    from mpsched._errors import SchedulerShutdownError, WorkerDismissedError

    service = ManagerService(JobQueue(), heartbeat_timeout=10)
    service.hello(hello("far", "some-other-host", 4242))
    service.stop()
    with pytest.raises(SchedulerShutdownError) as stopped:
        service.take("far", None, 0)
    assert not isinstance(stopped.value, WorkerDismissedError)  # it joins again later


def test_a_stopping_manager_knows_when_each_idle_remote_worker_heard_the_stop():
    # Its sockets must not close before: a pool that finds them closed says it lost its
    # manager, not that the manager stopped.
    from mpsched._errors import SchedulerShutdownError

    queue = JobQueue()
    service = ManagerService(queue, heartbeat_timeout=10)
    service.mailboxes.open("c")
    service.hello(hello("idle", "some-other-host", 4242))
    service.hello(hello("busy", "some-other-host", 4243))
    service.hello(started_here(service, "near"))  # a local worker: its manager stops it
    queue.submit(JobRequest("job-0", "c", b"", 2, 0.0, None))
    assert service.take("busy", None, 0)  # it runs job-0 past the stop
    service.stop()
    assert service.wait_workers_told(0) is False  # between two takes: not told yet
    with pytest.raises(SchedulerShutdownError):
        service.take("idle", None, 0)
    assert service.wait_workers_told(0) is True


def test_drain_workers_dismisses_the_remote_workers_after_their_reports():
    from mpsched._errors import WorkerDismissedError

    queue = JobQueue()
    service = ManagerService(queue)
    service.mailboxes.open("c")
    service.hello(hello("far", "some-other-host", 4242))
    service.hello(started_here(service, "near"))
    queue.submit(JobRequest("job-0", "c", b"", 2, 0.0, None))
    [wire] = service.take("far", None, 0)
    lease = assignment_from_wire(wire).lease
    assert service.drain_workers() == 1  # the remote one only
    outcome = Outcome("job-0", True, b"result", "", time.monotonic())
    with pytest.raises(WorkerDismissedError):
        service.take("far", [report_to_wire(Report(lease.lease_id, outcome))], 0)
    assert service.mailboxes.collect("c", 0) == [outcome]  # its report went in first
    assert service.take("near", None, 0) == []  # a local worker goes on taking
    service.leave("far", [])
    assert [w.worker_id for w in service.stats().workers] == ["near"]


def test_reports_sent_while_a_batch_goes_on_end_their_jobs_and_keep_the_worker_busy():
    # A worker handed several jobs reports the first ones while it runs the rest: they
    # end (and reach their client) at once, and the worker still counts as busy.
    queue = JobQueue()
    service = ManagerService(queue, heartbeat_timeout=10)
    service.mailboxes.open("c")
    service.hello(hello("w", "some-other-host", 4242))
    for n in range(2):
        queue.submit(JobRequest(f"job-{n}", "c", b"", 2, 0.0, None))
    [wire] = service.take("w", None, 0)
    first = assignment_from_wire(wire)
    outcome = Outcome("job-0", True, b"result", "", None)
    service.report("w", [report_to_wire(Report(first.lease.lease_id, outcome))])
    assert service.mailboxes.collect("c", 0) == [outcome]
    [worker] = service.stats().workers
    assert worker.jobs_done == 1 and worker.current_job == "job-0"
    assert service.workers.busy() == {"w"}


class OpenClaims:
    """Claims that let every local worker be handed prefetched jobs and revoke at once."""

    def __init__(self) -> None:
        self.revoked: list[tuple[str, int]] = []

    def reopen(self, worker_id: str) -> bool:
        return True

    def revoke(self, worker_id: str, lowest: int) -> int | None:
        self.revoked.append((worker_id, lowest))
        return lowest  # it started none of them


def test_a_worker_that_leaves_to_be_replaced_gives_back_the_jobs_it_did_not_start():
    claims = OpenClaims()
    queue = JobQueue(claims=claims)
    service = ManagerService(queue)
    service.hello(started_here(service, "w"))
    service.mailboxes.open("c")
    for n in range(4):
        queue.submit(JobRequest(f"job-{n}", "c", b"", 2, 0.0, None))
    first, *prefetched = [assignment_from_wire(w) for w in service.take("w", None, 0, more=3)]
    assert [a.lease.job_id for a in prefetched] == ["job-1", "job-2", "job-3"]
    outcome = Outcome("job-0", True, b"", "", None)
    service.finish("w", [report_to_wire(Report(first.lease.lease_id, outcome))])  # recycles
    assert claims.revoked == [("w", prefetched[0].lease.lease_id)]
    assert service.stats().queue.pending["medium"] == 3  # back in the heap, untouched
    service.hello(started_here(service, "w2"))
    again = [assignment_from_wire(w).lease for w in service.take("w2", None, 0)]
    assert [(lease.job_id, lease.attempt) for lease in again] == [("job-1", 1)]


# ------------------------------------------------------------------ what a worker left


def take_three(service: ManagerService, worker_id: str) -> list[str]:
    """Three jobs handed to ``worker_id`` one by one (each never reported)."""
    assert isinstance(service.queue, JobQueue)
    taken = []
    for n in range(3):
        service.queue.submit(JobRequest(f"job-{n}", "c", b"", 2, 0.0, None))
        [wire] = service.take(worker_id, None, 0)
        taken.append(assignment_from_wire(wire).lease.job_id)
    return taken


def test_what_a_gone_worker_left_ends_its_jobs_by_its_word() -> None:
    # It ran job-0 to its end (its report never arrived), was in job-1, never entered job-2.
    queue = JobQueue()
    service = ManagerService(queue)
    service.mailboxes.open("c")
    service.hello(hello("r", "another-host", 4242))
    take_three(service, "r")
    ran = Report(0, Outcome("job-0", True, b"result", "", None))
    service.worker_exited("r", -9, LeftBehind(job_digest("job-1"), (ran,)))
    ended = {o.job_id: o for o in service.mailboxes.collect("c", 0) or []}
    assert ended["job-0"].ok and ended["job-0"].payload == b"result"
    assert ended["job-1"].error_kind == "WorkerCrashedError"  # retries=0
    assert set(ended) == {"job-0", "job-1"}
    [(pending, worker)] = queue.jobs()
    assert pending.job_id == "job-2" and worker is None and pending.attempt == 0


def test_an_awaited_worker_that_never_comes_back_loses_every_job_as_received() -> None:
    # After a restart, a remote worker's jobs wait for it; silent past the heartbeat
    # timeout, each may have reached it: an attempt (never run again without retries).
    queue = JobQueue()
    service = ManagerService(queue, heartbeat_timeout=0.0)
    service.mailboxes.open("c")
    queue.submit(JobRequest("job-0", "c", b"", 2, 0.0, None))
    [job] = queue.cancel_jobs(["job-0"])
    job.attempt = 1
    queue.hold_in_flight("old", [job])
    service.workers.await_worker("old")
    assert len(service.workers) == 0 and service.stats().workers == ()
    [late], _ = service.expired_remote()
    assert late == "old"
    assert service.lose_worker("old", None) == 1
    [ended] = service.mailboxes.collect("c", 0) or []
    assert ended.error_kind == "WorkerCrashedError"
