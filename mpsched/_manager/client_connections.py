"""Which client each connection of the manager speaks for, so that the manager knows when
nobody can collect a client's outcomes any more.

A client opens with one connection and collects its outcomes on another (its result
thread); each proxied call runs in its connection's server thread, so a thread-local says
which client a connection belongs to. When every connection of a client has ended, the
client is gone (it died without closing).
"""

from __future__ import annotations

import threading


class ClientConnections:
    """Counts, per client, the connections that speak for it. Thread-safe."""

    def __init__(self) -> None:
        # Guards _counts. Nobody waits on it.
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        # Per server thread: the client its connection speaks for.
        self._local = threading.local()

    def speaks_for(self, client_id: str) -> None:
        """This server thread's connection belongs to ``client_id``."""
        if getattr(self._local, "client_id", None) == client_id:
            return
        self._local.client_id = client_id
        with self._lock:
            self._counts[client_id] = self._counts.get(client_id, 0) + 1

    def closed(self) -> str | None:
        """This server thread's connection ended: the client it spoke for if that was its
        last connection (nobody can collect its outcomes now), else None."""
        client_id: str | None = getattr(self._local, "client_id", None)
        if client_id is None:
            return None
        with self._lock:
            left = self._counts.pop(client_id, 1) - 1
            if left:
                self._counts[client_id] = left
                return None
        return client_id
