"""The SQLite store's reads: read-only connections of their own, reused, which WAL lets
read the last commit while the writer writes."""

from __future__ import annotations

import gc
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

from mpsched._errors import StoreError
from mpsched._store.commit import translate


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC: loading a million rows (tuples, all acyclic) would otherwise
    trigger collection after collection over the growing heap, doubling the load time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Readers:
    """Read-only connections, reused: each is used by one thread at a time."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._uri = f"file:{urllib.parse.quote(path)}?mode=ro"
        # Guards _idle and _closed; held only to take or return a connection.
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """A connection for one read; sqlite errors come out as StoreError."""
        with self._lock:
            if self._closed:
                raise StoreError(self._path, "the store is closed")
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = sqlite3.connect(
                    self._uri, uri=True, isolation_level=None, check_same_thread=False, timeout=2.0
                )
            yield conn
        except sqlite3.Error as exc:
            raise translate(exc, self._path) from exc
        finally:
            if conn is not None:
                self._give_back(conn)

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and not conn.in_transaction and len(self._idle) < 4:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
