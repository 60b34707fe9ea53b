"""The threads that answer the status server's requests, and how they read one.

The accepting thread (mpsched._manager.http.intake) hands over each connection whose
request head has arrived; :class:`Answering` answers it in a thread of its own, at most
MAX_ANSWERING at once (more wait their turn, without a thread). :class:`RequestReader` is
the request's reader for ``http.server``: the bytes the accepting thread read, then the
socket for the body.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from mpsched._manager.http.connections import Connection
from mpsched._manager.http.intake import MAX_HEAD

log = logging.getLogger("mpsched.http")

MAX_ANSWERING = 16  # threads answering requests at once; more requests wait their turn


class Answering:
    """The threads that answer requests: one per request, MAX_ANSWERING at most; requests
    beyond it wait for one to finish, without a thread."""

    def __init__(
        self, answer: Callable[[Connection], None], drop: Callable[[Connection], None]
    ) -> None:
        """``answer`` answers a connection's request(s) in a thread; ``drop`` closes one
        that gets no thread."""
        self._answer = answer
        self._drop = drop
        # Guards _queue and _threads: the accepting thread starts answers, each answering
        # thread takes the next from the queue when it is done. Nobody waits on it.
        self._lock = threading.Lock()
        self._queue: deque[Connection] = deque()
        self._threads = 0

    def start(self, connection: Connection) -> None:
        """Answer ``connection``'s request in a thread, now or when one is free."""
        with self._lock:
            if self._threads >= MAX_ANSWERING:
                self._queue.append(connection)
                return
            self._threads += 1
        try:
            threading.Thread(
                target=self._run, args=(connection,), daemon=True, name="mpsched-http-answer"
            ).start()
        except RuntimeError as exc:  # no thread to be had: this one closes
            log.error("status server: cannot answer a request: %s", exc)
            with self._lock:
                self._threads -= 1
            self._drop(connection)

    def _run(self, connection: Connection | None) -> None:
        while connection is not None:
            self._answer(connection)
            with self._lock:
                connection = self._queue.popleft() if self._queue else None
                if connection is None:
                    self._threads -= 1


class TooLarge(Exception):
    """A request's head passed MAX_HEAD bytes."""


class RequestReader:
    """A request's reader: the bytes the accepting thread read first, then the socket
    (each read waiting IO_TIMEOUT at most); its line and headers take MAX_HEAD bytes at
    most. Bytes past the request stay in the connection's ``head``, for the next one."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._left = MAX_HEAD

    def readline(self, limit: int = -1) -> bytes:
        if self._left < 0:
            raise TooLarge
        size = self._left + 1 if limit < 0 else min(limit, self._left + 1)
        head = self._connection.head
        while (end := head.find(b"\n", 0, size)) < 0 and len(head) < size:
            if not self._more(4096):
                break
        taken = end + 1 if end >= 0 else min(size, len(head))
        line = bytes(head[:taken])
        del head[:taken]
        self._left -= len(line)
        if self._left < 0:
            raise TooLarge
        return line

    def read(self, size: int) -> bytes:
        head = self._connection.head
        while len(head) < size and self._more(size - len(head)):
            pass
        data = bytes(head[:size])
        del head[:size]
        return data

    def _more(self, size: int) -> bool:
        """Read up to ``size`` more bytes into ``head``; False at the end."""
        chunk = self._connection.sock.recv(size)
        self._connection.head += chunk
        return bool(chunk)

    def close(self) -> None:
        pass
