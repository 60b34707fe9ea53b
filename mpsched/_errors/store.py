"""The errors of the job store: it cannot be opened, read or written, or does not answer."""

from __future__ import annotations

from mpsched._errors.base import MpschedError


class StoreError(MpschedError, OSError):
    """The job store could not be opened, read or written. The message names its path.

    Raised at open (missing or read-only directory, a file that is not an mpsched store or
    comes from a newer mpsched) and by the one call whose change could not be written.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"job store {path}: {reason}")

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class StoreLockedError(StoreError):
    """Another manager (process ``pid``, when known) has the store open: one manager per store."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.pid = pid
        holder = "another manager" if pid is None else f"another manager (pid {pid})"
        super().__init__(
            path, f"in use by {holder}, which holds {path}.lock; stop it or use another store"
        )

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, int | None]]:  # type: ignore[override]
        return (type(self), (self.path, self.pid))


class StoreFullError(StoreError):
    """The disk or the database was full: the changes of the failed batch were not written.

    Whatever was committed before stays; the store takes writes again once there is room.
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            path, "the disk or the database is full (SQLITE_FULL): this change was not written"
        )

    def __reduce__(self) -> tuple[type[StoreError], tuple[str]]:  # type: ignore[override]
        return (type(self), (self.path,))


class StoreUnavailableError(StoreError, ConnectionError):
    """A Redis store did not answer (down, restarting, unreachable, or too slow): the call
    failed without waiting for it to come back. Nothing was changed, unless the error is a
    StoreInDoubtError. Managers retry with back-off by themselves."""

    def __reduce__(self) -> tuple[type[StoreError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class StoreInDoubtError(StoreUnavailableError):
    """A Redis store took a change and gave no answer (it timed out, or the connection
    was lost on the way back), and did not answer again in time to tell whether it made
    it: a job submitted may be queued, and may run. Look it up by id (``Client.job``);
    a job submitted with ``key=`` may be submitted again safely."""
