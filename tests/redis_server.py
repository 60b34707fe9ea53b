"""A redis-server of a test's own: its own Unix socket (or port) and data directory, so a
test can kill it, restart it and change its settings. Never the system's Redis.

``make tools`` installs redis-server on a machine that lacks it (see the Makefile); a test
that needs it and finds none fails, saying so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process. ``url(prefix)`` names a store on it.

    Args:
        data_dir: where it keeps its files (AOF, RDB) and its log.
        tcp: listen on a free loopback port too (else only on its Unix socket).
        config: extra ``--name value`` settings (``appendonly``, ``requirepass`` ...).
    """

    def __init__(self, data_dir: Path, *, tcp: bool = False, **config: str) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: `make tools` installs it (apt-get)"
        self.binary = binary
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        # A Unix socket's path must fit in 108 bytes: tmp_path may be longer.
        self._socket_dir = tempfile.mkdtemp(prefix="mpsr-")
        self.socket = os.path.join(self._socket_dir, "redis.sock")
        self.port = free_port() if tcp else 0
        self.config = {"save": "", "appendonly": "no", **config}
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--unixsocket",
            self.socket,
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.data_dir / "redis.log"),
            "--daemonize",
            "no",
        ]
        for name, value in self.config.items():
            args += [f"--{name.replace('_', '-')}", value]
        return args

    def start(self) -> None:
        """Start it (again, on the same socket, port and data) and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with self.client() as probe:
                    probe.ping()
                    # Loading an AOF or RDB answers LOADING until it is done.
                    if not int(probe.info("persistence").get("loading", 0)):
                        return
            except (redis.ConnectionError, redis.BusyLoadingError, OSError):
                pass
            assert self.proc.poll() is None, f"redis-server exited at start: {self.log_tail()}"
            assert time.monotonic() < deadline, "redis-server did not answer in time"
            time.sleep(0.01)

    def client(self) -> redis.Redis:
        """A plain redis-py client of this server (for a test to look or set things)."""
        return redis.Redis(unix_socket_path=self.socket, password=self.config.get("requirepass"))

    def url(self, prefix: str = "mpsched", *, db: int = 0) -> str:
        """A store URL on this server's Unix socket."""
        password = self.config.get("requirepass")
        auth = f":{password}@" if password else ""
        return f"unix://{auth}{self.socket}?db={db}&prefix={prefix}"

    def tcp_url(self, prefix: str = "mpsched") -> str:
        assert self.port, "started without tcp=True"
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL it (nothing written after its last fsync survives) and reap it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop it for good (a finalizer: whatever state the test left it in)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def log_tail(self) -> str:
        path = self.data_dir / "redis.log"
        return path.read_text()[-2000:] if path.exists() else "(no log)"
