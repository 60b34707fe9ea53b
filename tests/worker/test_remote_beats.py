"""A remote worker's heartbeats (mpsched._worker.remote): the heartbeat thread's connection
is opened before the thread starts, and a beat that fails is not the last one. A stand-in
service records what the session does; the session's serving loop is replaced by one that
waits for the beats the test needs."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from mpsched._worker import remote
from mpsched._worker.process import DrainState
from mpsched._worker.stop_reasons import LoopEnd

BEATS_SEEN = 10.0  # seconds for a few beats 10 ms apart, on a loaded machine


class FakeConnection:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeService:
    """What ``_session`` and ``_heartbeats`` call on a ServiceProxy. The first ``failures``
    beats raise OSError (a connection reset)."""

    def __init__(self, failures: int = 0, open_fails: bool = False) -> None:
        self.failures = failures
        self.open_fails = open_fails
        self.opened: list[tuple[str, str]] = []  # (calling thread, thread it is for)
        self.used: list[tuple[str, Any]] = []  # (calling thread, connection)
        self.set_aside: list[FakeConnection] = []
        self.connection: Any = None
        # Guards beats and failures; the test's serving loop waits on it for beats.
        self.beat = threading.Condition()
        self.beats = 0

    def open_connection(self, thread_name: str) -> FakeConnection:
        self.opened.append((threading.current_thread().name, thread_name))
        if self.open_fails:
            raise ConnectionRefusedError("nothing listens there")
        self.connection = FakeConnection()
        return self.connection

    def use_connection(self, connection: Any) -> None:
        self.used.append((threading.current_thread().name, connection))

    def set_connection_aside(self) -> FakeConnection:
        broken = FakeConnection()
        self.set_aside.append(broken)
        return broken

    def heartbeat(self, worker_id: str, load: Any) -> None:
        with self.beat:
            if self.failures:
                self.failures -= 1
                raise ConnectionResetError("reset by peer")
            self.beats += 1
            self.beat.notify_all()

    def wait_beats(self, count: int) -> bool:
        with self.beat:
            return self.beat.wait_for(lambda: self.beats >= count, BEATS_SEEN)


def run_session(
    monkeypatch: pytest.MonkeyPatch, service: FakeService, beats: int
) -> tuple[LoopEnd, list[bool]]:
    """Run one session whose serving loop returns STOPPED once ``beats`` beats went
    through (or BEATS_SEEN passed); returns its end and whether the beats came."""
    came: list[bool] = []

    def serving(*args: Any, **kwargs: Any) -> LoopEnd:
        came.append(service.wait_beats(beats))
        return LoopEnd.STOPPED

    monkeypatch.setattr(remote, "serve", serving)
    config = SimpleNamespace(worker_id="w.0", heartbeat_interval=0.01)
    ended = remote._session(service, config, 10.0, DrainState())  # type: ignore[arg-type]
    return ended, came


def test_the_heartbeat_connection_is_opened_before_its_thread_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = FakeService()
    ended, came = run_session(monkeypatch, service, beats=2)
    assert (ended, came) == (LoopEnd.STOPPED, [True])
    # Opened by the session's own thread; the heartbeat thread only takes it.
    assert service.opened == [(threading.current_thread().name, remote.HEARTBEAT_THREAD)]
    assert service.used == [(remote.HEARTBEAT_THREAD, service.connection)]


def test_beats_go_on_after_some_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    service = FakeService(failures=3)
    ended, came = run_session(monkeypatch, service, beats=2)
    assert (ended, came) == (LoopEnd.STOPPED, [True])
    # Each failed beat's connection was put aside and closed: the next beat opens another.
    assert len(service.set_aside) == 3
    assert all(conn.closed for conn in service.set_aside)


def test_a_manager_lost_before_the_heartbeat_connection_opens_ends_the_session_as_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = FakeService(open_fails=True)
    ended, came = run_session(monkeypatch, service, beats=1)
    assert ended == LoopEnd.LOST
    assert came == []  # the session did not serve
