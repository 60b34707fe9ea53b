"""How a Redis store calls its Lua scripts (``lua/``): by name, by SHA (EVALSHA), each thread
on a connection of its own, loading a script again when the server has forgotten it (a
restart), and telling a script whose answer was lost from one that never went out.

Every thread calls them straight through redis-py's connection (a command out, a reply in):
its client's pool, retry and reply-callback layers cost more CPU than the call itself, on
the path every job takes. Those connections are made from the pool's settings but are
not the pool's: a pool counts the connections it made and refuses more past its cap,
and one lost here is never given back to it.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from importlib import resources
from typing import Any

NAMES = (
    "submit",
    "claim",
    "cancel",
    "watch",
    "drain",
    "heartbeat",
    "leave",
    "jobs",
    "prune",
    "unclaim",
    "progress",
    "requeue",
    "limit",
    "after",
)


class Unanswered(Exception):
    """A script went out whole and its answer did not come (a timeout, or the connection
    lost on the way back): the server may have run it, or may run it yet. ``cause`` is
    redis-py's error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def source(name: str) -> str:
    """The text of script ``name``: the shared helpers, then the script."""
    folder = resources.files("mpsched._store.redis").joinpath("lua")
    return folder.joinpath("common.lua").read_text() + folder.joinpath(f"{name}.lua").read_text()


class ScriptRunner:
    """The scripts by name on ``client``'s server, each thread on its own connection;
    every call passes ``base``, the deployment's key base."""

    def __init__(self, client: Any, base: str) -> None:
        self._base = base
        self._due_key = base + "due"  # every key shares its hash slot
        self._sources = {name: source(name) for name in NAMES}
        self._shas = {
            name: hashlib.sha1(text.encode()).hexdigest() for name, text in self._sources.items()
        }
        self._pool = client.connection_pool
        errors = importlib.import_module("redis").exceptions
        self._no_script = errors.NoScriptError
        self._lost = (errors.ConnectionError, errors.TimeoutError, OSError)
        self._timeout = errors.TimeoutError
        # Each thread's own connection (made on its first call), and all of them, so that
        # close() can end them; the list is guarded by _lock (nobody waits on it).
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Any] = []

    def _connection(self) -> Any:
        """This thread's connection, made on its first call."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._pool.connection_class(**self._pool.connection_kwargs)
            with self._lock:
                self._connections.append(conn)
        return conn

    def _lose(self, conn: Any) -> None:
        """Close a connection that failed; the thread's next call makes another."""
        conn.disconnect()
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def call(self, name: str, *args: Any) -> Any:
        """Run script ``name``; Unanswered when it went out and no answer came (it may
        have run); redis-py's error when it did not go out (it did not run)."""
        conn = self._connection()
        command = ("EVALSHA", self._shas[name], 1, self._due_key, self._base, *args)
        sent = False
        try:
            conn.send_command(*command)
            sent = True
            try:
                return conn.read_response()
            except self._no_script:  # the server restarted since: load it, call it again
                sent = False
                conn.send_command("SCRIPT", "LOAD", self._sources[name])
                conn.read_response()
                conn.send_command(*command)
                sent = True
                return conn.read_response()
        except self._lost as exc:
            self._lose(conn)
            if not isinstance(exc, self._timeout):
                self.reset()  # the server went away: every other connection is stale
            if sent:
                raise Unanswered(exc) from exc
            raise

    def reset(self) -> None:
        """Close every thread's connection; each thread's next call opens another (a
        restarted server answers none of the old ones)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.disconnect()

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.disconnect()
