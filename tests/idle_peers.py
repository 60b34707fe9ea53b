"""A flood of idle peers, for the handshake tests: run in a process of its own.

``python -c "import idle_peers; idle_peers.main()" HOST PORT SOURCES PER_SOURCE STATUS``
opens PER_SOURCE connections to HOST:PORT from each of the comma-separated SOURCES
addresses (127.0.0.x: all loopback on Linux), a few at a time, says nothing on any of
them, and reopens each one the manager closes (turned away, or dropped at its handshake
deadline), at once, for as long as it runs. Every 0.2 s it rewrites STATUS (JSON,
atomically) with its counts:

- ``holding``: connections now in their handshake (they got a challenge);
- ``challenged``, ``refused``: connections that got a challenge / a refusal, in all;
- ``dropped``: challenged connections the manager closed later (at their deadline, or to
  make room for newer ones);
- ``closed``: connections the server closed, whatever it said (any server: a status
  page's too).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import selectors
import socket
import sys
import time
from collections import Counter
from typing import Any

CONNECTING = 8  # connects in progress at once: a burst of SYNs would overflow the backlog


class _Peer:
    def __init__(self, source: str, target: tuple[str, int]) -> None:
        self.sock = socket.socket()
        self.sock.setblocking(False)
        self.sock.bind((source, 0))
        code = self.sock.connect_ex(target)
        if code not in (0, errno.EINPROGRESS):
            raise OSError(code, os.strerror(code))
        self.source = source
        self.connected = False
        self.seen = b""
        self.challenged = False


def main(argv: list[str] | None = None) -> None:
    host, port, sources, per_source, status = (argv or sys.argv[1:])[:5]
    _enough_descriptors(len(sources.split(",")) * int(per_source) + 64)
    target = (host, int(port))
    selector = selectors.DefaultSelector()
    counts: Counter[str] = Counter()
    to_open = [source for _ in range(int(per_source)) for source in sources.split(",")]
    connecting = 0
    reported = 0.0
    while True:
        while to_open and connecting < CONNECTING:
            peer = _Peer(to_open.pop(0), target)
            selector.register(peer.sock, selectors.EVENT_WRITE, peer)
            connecting += 1
        for key, _ in selector.select(0.1):
            peer = key.data
            if not peer.connected:
                connecting -= 1
                peer.connected = True
                if not peer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    selector.modify(peer.sock, selectors.EVENT_READ, peer)
                    continue
            elif _read(peer, counts):
                continue
            selector.unregister(peer.sock)
            peer.sock.close()
            counts["closed"] += 1
            if peer.challenged:
                counts["holding"] -= 1
                counts["dropped"] += 1
            to_open.append(peer.source)
        if time.monotonic() - reported > 0.2:
            _report(status, counts)
            reported = time.monotonic()


def _read(peer: _Peer, counts: Counter[str]) -> bool:
    """Take what arrived; False once the manager closed the connection."""
    try:
        data = peer.sock.recv(4096)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not data:
        return False
    peer.seen += data
    if not peer.challenged and b"#CHALLENGE#" in peer.seen:
        peer.challenged = True
        counts["challenged"] += 1
        counts["holding"] += 1
    if b"#REFUSED#" in peer.seen:
        counts["refused"] += 1
        peer.seen = b""
    return True


def _report(path: str, counts: Counter[str]) -> None:
    with open(path + ".new", "w") as out:
        json.dump(dict(counts), out)
    os.replace(path + ".new", path)


def _enough_descriptors(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def read_status(path: Any) -> Counter[str]:
    """The counts the flood wrote last (none yet: all zero)."""
    try:
        with open(path) as status:
            return Counter(json.load(status))
    except FileNotFoundError:
        return Counter()
