"""FastConnection's framing: plain pickles, and large payloads out of band (no copies)."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpsched import RetryPolicy
from mpsched._core.job import JobRequest, Outcome
from mpsched._protocol.codec import (
    BLOB,
    outcome_from_wire,
    outcome_to_wire,
    request_from_wire,
    request_to_wire,
)
from mpsched._transport import wire as _wire
from mpsched._transport.wire import FastConnection


@pytest.fixture
def pair() -> Iterator[tuple[FastConnection, FastConnection]]:
    a, b = socket.socketpair()
    ends = FastConnection(a), FastConnection(b)
    yield ends
    for end in ends:
        end.close()


@pytest.fixture
def in_thread() -> Iterator[Callable[[Callable[[], Any]], None]]:
    """Runs a send in a thread (a large message fills the socket buffer before it is
    read); the thread is joined when the test ends."""
    threads: list[threading.Thread] = []

    def start(send: Callable[[], Any]) -> None:
        threads.append(threading.Thread(target=send, daemon=True))
        threads[-1].start()

    yield start
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture(params=[_wire._READ, 7], ids=["reads-64k", "reads-7"])
def read_size(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Small reads put every message boundary in the middle of a read."""
    monkeypatch.setattr(_wire, "_READ", request.param)
    return int(request.param)


def test_a_pickle_buffer_crosses_out_of_band_into_a_buffer_of_its_own(pair, read_size, in_thread):
    sender, receiver = pair
    data, other = os.urandom(3 * BLOB), os.urandom(BLOB + 3)

    def send() -> None:
        sender.send(("first", pickle.PickleBuffer(data), [pickle.PickleBuffer(bytearray(other))]))
        sender.send(("plain", data[:10]))
        sender.send_bytes(b"raw")

    in_thread(send)
    name, view, [writable] = receiver.recv()
    assert name == "first" and view.readonly and view == data
    assert type(view.obj) is bytearray and len(view.obj) == len(data)  # received into it
    assert type(writable) is bytearray and writable == other
    assert receiver.recv() == ("plain", data[:10])
    assert receiver.recv_bytes() == b"raw"


def test_the_pickle_of_an_out_of_band_message_holds_no_payload(pair, monkeypatch, in_thread):
    sender, receiver = pair
    pickled: list[int] = []
    real = pickle.loads

    def loads(data: bytes, **kwargs: Any) -> object:
        pickled.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(pickle, "loads", loads)
    in_thread(lambda: sender.send(("x", pickle.PickleBuffer(bytes(4 * BLOB)))))
    assert receiver.recv()[1] == bytes(4 * BLOB)
    assert pickled and pickled[0] < 100


def test_large_payloads_cross_without_becoming_bytes_again(pair, in_thread):
    sender, receiver = pair
    big, small = os.urandom(BLOB), b"small"
    requests = [JobRequest("a", "c", big, 2, 0.0, None), JobRequest("b", "c", small, 2, 0.0, None)]
    in_thread(lambda: sender.send([request_to_wire(r) for r in requests]))
    got = [request_from_wire(w) for w in receiver.recv()]
    assert got == requests
    assert type(got[0].payload) is bytearray and type(got[1].payload) is bytes
    outcome = Outcome("a", True, got[0].payload, "", None)  # passed on as it came
    in_thread(lambda: receiver.send([outcome_to_wire(outcome)]))
    [back] = [outcome_from_wire(w) for w in sender.recv()]
    assert back == outcome and type(back.payload) is bytearray


def test_a_buffer_table_longer_than_its_message_is_refused(pair):
    sender, receiver = pair
    table = _wire._BUFFERS.pack(0, 1) + _wire._BUFFER.pack(1 << 40)
    sender.send_bytes(table + b"\x80\x05N.")
    with pytest.raises(OSError, match="do not fit"):
        receiver.recv()
    assert receiver.closed


def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
def test_a_waiting_reader_is_not_woken_when_its_peer_takes_what_it_sent(
    pair: tuple[FastConnection, FastConnection],
) -> None:
    # Linux wakes the waiters of a Unix socket when its peer takes in data it sent (room
    # freed): a caller blocked in recv() right after its send, as every proxy call is,
    # would be woken once for nothing per call, and once more by the reply.
    mine, peer = pair
    rounds = 200
    tids: list[int] = []
    switches: list[int] = []

    def caller() -> None:
        tids.append(threading.get_native_id())
        before = _voluntary_switches(tids[0])
        for i in range(rounds):
            mine.send(("call", i))
            assert mine.recv() == ("reply", i)
        switches.append(_voluntary_switches(tids[0]) - before)

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        for i in range(rounds):
            assert peer.recv() == ("call", i)
            # Give a wake-up for nothing the time to show (the caller runs, sleeps again).
            seen, until = _voluntary_switches(tids[0]), time.monotonic() + 0.002
            while _voluntary_switches(tids[0]) == seen and time.monotonic() < until:
                pass
            peer.send(("reply", i))
    finally:
        thread.join(30)
    assert switches and switches[0] < 1.5 * rounds, (
        f"{switches[0] / rounds:.2f} sleeps per call: woken for nothing"
    )


def test_a_request_without_a_retry_policy_crosses_without_a_field_for_it(pair, in_thread):
    sender, receiver = pair
    terms = RetryPolicy(2).terms()
    big = os.urandom(BLOB)
    plain, retried = (
        JobRequest("a", "c", b"p", 2, 0.0, None),
        JobRequest("b", "c", big, 2, 0.0, None, retries=2, retry=terms),
    )
    routed = JobRequest("c", "c", b"p", 2, 0.0, None, queue="gpu", limit="exports")
    # without retry, queue and limit: the plain path pays no byte for any of them
    assert len(request_to_wire(plain)) == len(JobRequest._fields) - 3
    assert pickle.dumps(request_to_wire(plain)) == pickle.dumps(tuple(plain)[:-3])
    in_thread(lambda: sender.send([request_to_wire(r) for r in (plain, retried, routed)]))
    assert [request_from_wire(w) for w in receiver.recv()] == [plain, retried, routed]
