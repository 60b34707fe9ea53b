"""StoreFailures: what a client says while its manager's shared store does not answer:
one ERROR line when its batches start failing for it, one WARNING when one goes through
again, with how long it lasted and how many jobs failed meanwhile; none per batch."""

from __future__ import annotations

import logging
import threading
import time

from mpsched._errors import StoreUnavailableError

log = logging.getLogger("mpsched.client")


class StoreFailures:
    """The batches of one client that its manager's store failed, while it fails them."""

    def __init__(self, client_id: str) -> None:
        self._client_id = client_id
        # Guards _since and _failed; nobody waits on it. sent() reads _since without it
        # first: one attribute, read whole, on the path of every batch.
        self._lock = threading.Lock()
        self._since: float | None = None  # time.monotonic() of the first failure
        self._failed = 0

    def failed(self, count: int, error: StoreUnavailableError) -> None:
        """A batch of ``count`` jobs failed: the store did not answer."""
        with self._lock:
            first = self._since is None
            if first:
                self._since, self._failed = time.monotonic(), 0
            self._failed += count
        if first:
            log.error(
                "mpsched client %s: the manager's job store does not answer (%s); "
                "jobs sent meanwhile fail with StoreUnavailableError (said once; "
                "counted when it answers again)",
                self._client_id,
                error,
            )

    def sent(self) -> None:
        """A batch went through."""
        if self._since is None:
            return
        with self._lock:
            since, failed, self._since = self._since, self._failed, None
        if since is not None:
            log.warning(
                "mpsched client %s: the manager's job store answers again after "
                "%.1f s; %d job(s) failed meanwhile",
                self._client_id,
                time.monotonic() - since,
                failed,
            )
