"""The handle of one recurring schedule of a manager: :class:`Schedule`.

A handle is by id: each property asks the manager, so every client sees the same schedule,
and two handles to one id at one manager are equal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from mpsched._client.job_future import JobFuture
from mpsched._client.link import ManagerLink
from mpsched._core.recurring import ScheduleAction, ScheduleCounters, ScheduleInfo, zone
from mpsched._errors import InvalidJobError, JobNotFoundError, ScheduleNotFoundError


class Schedule:
    """A recurring schedule in the manager. Each property and method asks the manager, so
    every client sees the same state; ``cancel()`` from any client stops it for all.
    Handles are by id: two handles to one schedule id at one manager (from two ``every()``
    calls that upserted it, from ``schedules()``, from two clients) are equal and hash
    equal.

    Counters: ``runs`` (runs started), ``skipped`` (slots passed over because the previous
    run was still pending or running, with ``overlap="skip"``), ``missed`` (slots not run
    after downtime or a backlog, as ``catchup`` says), ``failed`` (runs that raised or
    crashed after their retries).
    """

    def __init__(
        self, link: ManagerLink, info: ScheduleInfo, watch: Callable[[str], JobFuture[Any]]
    ) -> None:
        self._link = link  # its client's: the manager's proxy, another after a reconnect
        self._info = info
        self._watch = watch

    def __repr__(self) -> str:
        return f"<Schedule {self.id!r} {self._info.spec}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[str, str]:
        return self._link.address, self.id

    @property
    def id(self) -> str:
        """The schedule's id; its runs' job ids are ``"{id}@{planned UTC time}"``."""
        return self._info.schedule_id

    def info(self) -> ScheduleInfo:
        """The schedule as the manager reports it now.

        Raises:
            ScheduleNotFoundError: it was cancelled (its ``cancelled`` is True for
                ``result_ttl``, while its runs stay listable).
            ManagerConnectionLostError: the manager is unreachable.
        """
        self._info = self._control(ScheduleAction.INFO)
        return self._info

    @property
    def next_run(self) -> datetime | None:
        """When the next run is planned (aware, in the schedule's zone; UTC for every),
        or None when paused; ``info().next_run``."""
        return self.info().next_run

    @property
    def counters(self) -> ScheduleCounters:
        return self.info().counters

    @property
    def paused(self) -> bool:
        return self.info().paused

    def preview(self, n: int = 5) -> list[datetime]:
        """The next ``n`` planned run times (aware datetimes), without running anything."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 10_000:
            raise InvalidJobError(f"n must be an int in [0, 10000], not {n!r}")
        return [
            self._datetime(t)
            for t in self._link.ask(lambda service: service.schedule_preview(self.id, n))
        ]

    def pause(self) -> None:
        """Stop planning runs; an armed run that has not started is withdrawn."""
        self._info = self._control(ScheduleAction.PAUSE)

    def resume(self) -> None:
        """Plan runs again from now on (slots that passed while paused are not run)."""
        self._info = self._control(ScheduleAction.RESUME)

    def cancel(self) -> bool:
        """Remove the schedule: no run starts after this returns; a running one finishes.

        Idempotent, as ``Future.cancel()``: True if this call cancelled it, False if it
        was cancelled already (by this handle, another handle or another client), however
        long ago. A handle's id was the manager's, so an id the manager does not know (any
        more) was cancelled: this never raises ScheduleNotFoundError.

        Raises:
            ManagerConnectionLostError: the manager is unreachable.
        """
        try:
            self._info = self._control(ScheduleAction.CANCEL)
        except ScheduleNotFoundError:
            return False
        return True

    def runs(self, n: int = 10) -> list[JobFuture[Any]]:
        """Futures of the ``n`` latest runs, oldest first (the last may still be pending;
        a run that has ended is done in the future returned). A cancelled schedule's runs
        stay listable for the manager's ``result_ttl`` (its armed run, withdrawn, is a
        cancelled future).

        Ended runs are kept as any ended job is (for ``result_ttl``; without a store in
        memory, within its bounds, and a schedule's 10 latest outcomes beyond them); older
        ones are left out.

        Raises:
            ScheduleNotFoundError: it was cancelled more than ``result_ttl`` ago.
            ManagerConnectionLostError: the manager is unreachable.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 100:
            raise InvalidJobError(f"n must be an int in [0, 100], not {n!r}")
        futures = []
        for rid in self._link.ask(lambda service: service.schedule_runs(self.id, n)):
            try:
                futures.append(self._watch(rid))
            except JobNotFoundError:
                continue  # finished and forgotten
        return futures

    def _datetime(self, epoch: float) -> datetime:
        tz = zone(self._info.tz) if self._info.tz else timezone.utc
        return datetime.fromtimestamp(epoch, tz)

    def _control(self, action: ScheduleAction) -> ScheduleInfo:
        return self._link.ask(lambda service: service.schedule_control(self.id, action))
