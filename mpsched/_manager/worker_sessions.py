"""WorkerSessions: what a worker tells the manager, from its hello to its leave.

A worker joins (its versions checked), takes due jobs with the reports of its last batch,
reports early from its reporter thread, beats, notes progress, and leaves: drained,
recycled, or gone, as its pool says. Each of these is one proxied call of ManagerService,
which hands it here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mpsched._core.job import Lease
from mpsched._core.queue_like import JobQueueLike
from mpsched._errors import JobNotFoundError, StoreError
from mpsched._manager.dispatch import Dispatch
from mpsched._manager.endings import Endings
from mpsched._manager.journal import BaseJournal
from mpsched._manager.versions import Versions
from mpsched._manager.worker_table import WorkerTable
from mpsched._protocol.codec import AssignmentWire, ReportWire, report_from_wire
from mpsched._protocol.records import LeftBehind, WorkerHello, WorkerLoad

log = logging.getLogger("mpsched.manager")


class WorkerSessions:
    """The workers' calls: joining, taking and reporting, beating, and leaving; and the
    supervisor's word on workers that exited or fell silent."""

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        workers: WorkerTable,
        endings: Endings,
        dispatch: Dispatch,
        versions: Versions,
        heartbeat_timeout: float,
        wake_supervisor: Callable[[], None],
    ) -> None:
        """``heartbeat_timeout``: what each worker's heartbeats must beat.
        ``wake_supervisor``: called when a worker joins (its table changed)."""
        self._queue = queue
        self._journal = journal
        self._workers = workers
        self._endings = endings
        self._dispatch = dispatch
        self._versions = versions
        self._heartbeat_timeout = heartbeat_timeout
        self._wake_supervisor = wake_supervisor

    def hello(self, hello: WorkerHello) -> float:
        """Register a worker; returns the heartbeat timeout its heartbeats must beat."""
        self._versions.check(
            f"worker {hello.worker_id} on {hello.host}", (hello.python, hello.cloudpickle)
        )
        self._workers.join(hello)
        self._wake_supervisor()
        log.info("worker %s joined (pid %d on %s)", hello.worker_id, hello.pid, hello.host)
        return self._heartbeat_timeout

    def take(
        self, worker_id: str, reports: list[ReportWire] | None, timeout: float, more: int = 0
    ) -> list[AssignmentWire]:
        """Report the worker's last batch, then wait for its next jobs: see
        ManagerService.take."""
        local = self._workers.check_in(worker_id, reported=len(reports or ()))
        if reports:  # a shared store claims its next jobs with these ends: as many
            self._endings.complete_all(
                [report_from_wire(r) for r in reports],
                worker_id,
                same_clock=local,
                more=more if local else 0,
            )
        return self._dispatch.take(worker_id, local, timeout, more)

    def report(self, worker_id: str, reports: list[ReportWire]) -> None:
        """Report jobs a worker ran while it holds more of its batch."""
        local = self._workers.check_in(worker_id, reported=len(reports), busy=True)
        self._endings.complete_all(
            [report_from_wire(r) for r in reports], worker_id, same_clock=local
        )

    def progress(self, worker_id: str, updates: list[tuple[int, str, str]]) -> None:
        """Note the latest progress of jobs a worker runs: see ManagerService.progress."""
        for lease_id, job_id, progress in updates:
            try:
                self._journal.progress(lease_id, job_id, progress)
            except StoreError as exc:  # progress is news, not state: the job goes on
                log.warning("the progress of job %s was not recorded: %s", job_id, exc)

    def retry_budget(self, job_id: str) -> int:
        """How many times a job may run again after its current run fails.

        Raises:
            JobNotFoundError: the manager knows no such job.
        """
        job = self._queue.leases.job_of(job_id)  # it runs: on this manager's leases
        if job is not None:
            return job.retry.max_retries if job.retry is not None else job.retries
        record = self._journal.get(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return record.retries

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        """A worker is alive, and this is its load."""
        self._workers.check_in(worker_id, reported=0)
        self._workers.update(worker_id, load=load)

    def finish(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """Report the last jobs of a worker leaving to be replaced; the prefetched jobs it
        did not start go back to the heap."""
        if reports:
            local = self._workers.check_in(worker_id, reported=len(reports))
            self._endings.complete_all(
                [report_from_wire(r) for r in reports], worker_id, same_clock=local
            )
        self._queue.revoke(worker_id)

    def leave(self, worker_id: str, reports: list[ReportWire] | None) -> None:
        """A remote worker leaves (drained): report its last jobs and end its leases."""
        self.finish(worker_id, reports)
        self.lose_worker(worker_id, exitcode=0)

    def exited(self, worker_id: str, exitcode: int | None, left: LeftBehind | None) -> None:
        """A remote worker is gone: resolve the jobs it held now (see
        ManagerService.worker_exited)."""
        if left is None:
            held = self.lose_worker(worker_id, exitcode)
        else:
            held = self._endings.resolve_left(worker_id, exitcode, left, same_clock=False)
        if held and exitcode is not None:
            log.error(
                "remote worker %s exited with code %s holding %d job(s)", worker_id, exitcode, held
            )
        elif held:
            log.warning(
                "remote worker %s is gone (its pool, or it, said so) holding %d job(s)",
                worker_id,
                held,
            )

    def resolve_left(self, worker_id: str, exitcode: int | None, left: LeftBehind) -> int:
        """A local worker exited, and its durable claim slot says what it left: see
        Endings.resolve_left; returns how many leases it held besides the ended ones."""
        return self._endings.resolve_left(worker_id, exitcode, left, same_clock=True)

    def expired_remote(self) -> tuple[list[str], float | None]:
        """Remote workers silent past the heartbeat timeout, and the next such deadline."""
        return self._workers.expired_remote(self._heartbeat_timeout)

    def lose_worker(
        self, worker_id: str, exitcode: int | None, received: Callable[[Lease], bool] | None = None
    ) -> int:
        """Forget a worker and resolve each job it held; returns how many it held (see
        Endings.lose_worker)."""
        return self._endings.lose_worker(worker_id, exitcode, received)
