"""StoreOutage: what a manager says when its shared store stops answering, and when it is back:
one WARNING per outage, one INFO line at its end, however many calls failed meanwhile."""

from __future__ import annotations

import logging
import threading

from mpsched._errors import StoreUnavailableError

log = logging.getLogger("mpsched.manager")


class StoreOutage:
    """One WARNING when Redis stops answering, one INFO line when it is back."""

    def __init__(self, location: str) -> None:
        self._location = location
        # Guards _since; nobody waits on it.
        self._lock = threading.Lock()
        self._since: StoreUnavailableError | None = None

    def __call__(self, error: StoreUnavailableError | None) -> None:
        with self._lock:
            was, self._since = self._since, error if error is not None else None
            if was is None and error is not None:
                log.warning("the job store does not answer (%s); retrying with back-off, "
                            "jobs that run go on", error)
            elif was is not None and error is None:
                log.info("the job store %s answers again", self._location)

    @property
    def down(self) -> bool:
        with self._lock:
            return self._since is not None
