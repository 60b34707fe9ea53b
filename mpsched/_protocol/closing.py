"""How a ServiceProxy closes the connections it opened, rather than leaving them to the
garbage collector: when the thread that used one ends, when the proxy is collected, and
the connection of its decref (mpsched._protocol.proxy)."""

from __future__ import annotations

import contextlib
import threading
from multiprocessing.managers import State, dispatch  # type: ignore[attr-defined]
from typing import Any


def decref(token: Any, authkey: bytes | None, state: Any, idset: Any, client: Any) -> None:
    """Tell the manager a collected proxy no longer refers to its object (BaseProxy._decref,
    closing its connection; the proxy's own are closed by close_all)."""
    idset.discard(token.id)
    if state is None or state.value == State.STARTED:
        try:
            with contextlib.closing(client(token.address, authkey=authkey)) as conn:
                dispatch(conn, None, "decref", (token.id,))
        except Exception:  # the manager is gone: nothing refers to anything there any more
            pass


def close_one(connections: set[Any], lock: threading.Lock, connection: Any) -> None:
    """Close a connection of a proxy's whose thread ended."""
    with lock:
        connections.discard(connection)
    with contextlib.suppress(OSError):
        connection.close()


def close_all(connections: set[Any], lock: threading.Lock) -> None:
    """Close every connection of a proxy that was collected."""
    with lock:
        closing = list(connections)
        connections.clear()
    for connection in closing:
        with contextlib.suppress(OSError):
            connection.close()
