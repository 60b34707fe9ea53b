"""StoreOutage: what a manager says when its shared store stops answering, and when it is back:
one WARNING per outage, one line at its end with how long it lasted, however many calls
failed meanwhile; and who must act at once when it is back (the takers look again)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mpsched._errors import StoreUnavailableError

log = logging.getLogger("mpsched.manager")


class StoreOutage:
    """One WARNING when Redis stops answering, one WARNING when it is back (with how long
    it was away and what waited meanwhile); ``on_back`` callbacks run then, in the thread
    whose call found it back."""

    def __init__(self, location: str) -> None:
        self._location = location
        # Guards _since, _started, _held and _on_back; nobody waits on it.
        self._lock = threading.Lock()
        self._since: StoreUnavailableError | None = None
        self._started = 0.0  # time.monotonic() when the outage began
        self._held: dict[str, int] = {}  # what waited for the store, by kind: counts
        self._on_back: list[Callable[[], None]] = []

    def on_back(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (without the lock) each time the store answers again."""
        with self._lock:
            self._on_back.append(callback)

    def __call__(self, error: StoreUnavailableError | None) -> None:
        with self._lock:
            was, self._since = self._since, error
            if was is None and error is not None:
                self._started = time.monotonic()
                self._held = {}
                log.warning(
                    "the job store does not answer (%s); retrying with back-off, "
                    "jobs that run go on",
                    error,
                )
                return
            if was is None or error is not None:
                return
            lasted = time.monotonic() - self._started
            held = ", ".join(f"{count} {kind}" for kind, count in self._held.items())
            callbacks = list(self._on_back)
        log.warning(
            "the job store %s answers again after %.1f s%s",
            self._location,
            lasted,
            f" ({held} waited for it and are sent now)" if held else "",
        )
        for callback in callbacks:
            callback()

    def held(self, kind: str, count: int = 1) -> None:
        """Count ``count`` things of ``kind`` that wait for the store (said once, when it
        is back, instead of a line each)."""
        with self._lock:
            self._held[kind] = self._held.get(kind, 0) + count

    @property
    def down(self) -> bool:
        with self._lock:
            return self._since is not None
