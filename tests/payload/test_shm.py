"""Shared-memory payloads in one process: segments, frames, pickling, ownership, bounds."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import threading

import jobs
import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Outcome, PayloadOptions
from mpsched._core.queue import JobQueue
from mpsched._errors import InvalidJobError, QueueFullError
from mpsched._manager.mailbox import Mailboxes
from mpsched._payload import frames, pickling, shm
from mpsched._payload.pickling import dumps_result, loads, pickle_job
from mpsched._payload.segment_pool import SegmentPool
from mpsched._payload.segments import Segments

BIG = 2 * shm.THRESHOLD


def job_payload(prefix: str, *args: object) -> bytes:
    """A job whose large buffers get a segment of their own (none is reused)."""
    return pickle_job(jobs.noop, args, {}, pool=SegmentPool(prefix, "c", max_size=0))


def test_large_buffers_go_out_of_band_once_and_come_back_as_their_types(prefix):
    data = os.urandom(BIG)
    mutable = bytearray(data)
    payload = job_payload(prefix, data, mutable, memoryview(data), [data, 1], "small")
    frame = frames.parse(payload)
    assert frame is not None and frame.segment.startswith(prefix + "j")
    assert len(payload) < 1024  # only the name and a small pickle cross the manager
    assert shm.names(prefix) == [frame.segment]
    assert len(frame.entries) == 3  # ``data`` passed twice is stored once
    _, (got, got_mutable, view, nested, small), _ = loads(payload)
    assert type(got) is bytes and got == data
    assert type(got_mutable) is bytearray and got_mutable == mutable
    assert type(view) is memoryview and view == data
    assert nested == [data, 1] and small == "small"
    assert shm.payload_size(payload) == len(payload) + frame.size
    shm.release(payload)
    assert shm.names(prefix) == []


def test_writable_buffers_are_mapped_not_copied_and_writes_stay_private(prefix):
    payload = job_payload(prefix, jobs.Mapped(bytearray(BIG)))
    for _ in range(2):  # a retried job sees the argument as it was submitted
        _, (arg,), _ = loads(payload)
        assert jobs.inspect_mapped(arg) == ("mmap", True, 255)
    shm.release(payload)


def test_small_arguments_stay_in_the_pickle_behind_an_empty_frame(prefix):
    payload = job_payload(prefix, b"x" * 100)
    frame = frames.parse(payload)
    assert frame is not None and frame.segment == "" and frame.entries == ()
    assert loads(payload)[1] == (b"x" * 100,)
    assert shm.names(prefix) == []
    assert pickle_job(jobs.noop, (b"x" * 100,), {})[:1] == b"\x80"  # no pool: plain
    assert pickle_job(jobs.noop, (b"x" * BIG,), {})[:4] == frames.CARRIED  # or carried


def test_a_payload_without_shared_memory_carries_its_buffers_after_its_frame():
    data, mutable = os.urandom(BIG), bytearray(os.urandom(BIG + 1))
    payload = pickle_job(jobs.noop, (data, mutable, jobs.Mapped(bytearray(BIG))), {})
    frame = frames.parse(payload)
    assert frame is not None and frame.segment == "" and len(frame.entries) == 3
    assert [e.offset % frames.ALIGN for e in frame.entries] == [0, 0, 0]
    assert len(payload) < frame.size + 1024 and shm.payload_size(payload) == len(payload)
    _, (got, got_mutable, mapped), _ = loads(payload)
    assert type(got) is bytes and got == data
    assert type(got_mutable) is bytearray and got_mutable == mutable
    assert jobs.inspect_mapped(mapped) == ("bytearray", True, 255)
    assert loads(dumps_result(data)) == data and dumps_result(data)[:4] == frames.CARRIED


def test_a_payload_for_a_remote_worker_carries_its_buffers_itself(prefix):
    data = os.urandom(BIG)
    payload = job_payload(prefix, data, jobs.Mapped(bytearray(BIG)), "small")
    carried = shm.inline(payload)
    assert frames.segment_of(carried) == "" and shm.payload_size(carried) == len(carried)
    shm.release(payload)  # the worker reads nothing from shared memory
    _, (got, mapped, small), _ = loads(carried)
    assert got == data and small == "small"
    assert jobs.inspect_mapped(mapped) == ("bytearray", True, 255)  # a copy it may write
    assert shm.inline(carried) is carried
    assert shm.inline(job_payload(prefix, b"small"))[:4] == frames.MAGIC


@pytest.mark.parametrize(
    "result",
    [None, True, 7, 10**40, 2.5, 3 + 4j, "text naming __main__", (1, "x", None, 2.0)],
    ids=repr,
)
def test_a_plain_result_is_pickled_at_once(prefix, monkeypatch, result):
    # None, numbers, strings and short tuples of them hold nothing to look for: the C
    # pickler takes them without the walk for large buffers or the check for names in
    # the main module (a string that only mentions __main__ included).
    def no_walk(*args: object) -> object:
        raise AssertionError("a plain result was walked for large buffers")

    monkeypatch.setattr(pickling, "_wrap", no_walk)
    payload = dumps_result(result, shm.result_name(prefix, 21))
    assert payload[:1] == b"\x80" and loads(payload) == result
    assert shm.names(prefix) == []
    with pytest.raises(AssertionError, match="walked"):  # anything else is still looked at
        dumps_result([result])
    with pytest.raises(AssertionError, match="walked"):
        dumps_result(tuple(range(9)))


def test_a_result_goes_to_the_segment_named_for_its_lease(prefix):
    name = shm.result_name(prefix, 17)
    payload = dumps_result(bytes(BIG), name)
    assert frames.segment_of(payload) == name and loads(payload) == bytes(BIG)
    assert dumps_result(5, shm.result_name(prefix, 18))[:1] == b"\x80"
    assert shm.names(prefix) == [name]
    shm.release(payload)


def test_a_full_shared_memory_sends_the_job_inline(prefix, monkeypatch, caplog):
    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(shm, "_logged", set())
    with caplog.at_level(logging.INFO, logger="mpsched.shm"):
        first = job_payload(prefix, bytes(BIG))
        second = job_payload(prefix, bytes(BIG))
    assert first[:4] == second[:4] == frames.CARRIED  # inline: the buffer after the frame
    assert loads(first)[1] == (bytes(BIG),)
    assert shm.names(prefix) == []  # the half-written segment was removed
    assert [r.levelname for r in caplog.records] == ["INFO"]  # logged once


def test_a_client_that_cannot_read_the_probe_sends_inline(prefix):
    options = PayloadOptions(prefix, b"token", None)
    assert shm.shared_with(options) == ""  # no probe segment: another /dev/shm
    shm.write(prefix + "probe", [memoryview(b"token")])
    assert shm.shared_with(options) == prefix
    assert shm.shared_with(options._replace(probe=b"other")) == ""
    assert shm.shared_with(PayloadOptions("", b"", None)) == ""
    shm.sweep(prefix)


def test_segments_of_stopped_managers_are_removed_at_start(prefix):
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    dead_prefix = shm.manager_prefix(gone.pid)
    gone.wait()
    shm.write(dead_prefix + "jleft", [memoryview(b"x")])
    shm.write(prefix + "jmine", [memoryview(b"x")])
    try:
        assert shm.sweep_dead_managers() >= 1
        assert shm.names(dead_prefix) == []
        assert shm.names(prefix) == [prefix + "jmine"]  # a live manager keeps its own
    finally:
        shm.sweep(dead_prefix)
        shm.sweep(prefix)


# ------------------------------------------------------------------ manager ownership


def owner(prefix: str) -> Segments:
    return Segments(prefix, b"")


def request(job_id: str, payload: bytes) -> JobRequest:
    return JobRequest(job_id, "c", payload, 2, 0.0, None)


def test_the_manager_unlinks_a_job_s_arguments_once_it_has_ended(prefix):
    segments = owner(prefix)
    payloads = {j: job_payload(prefix, bytes(BIG)) for j in ("a", "b", "c")}
    batch = [request(j, p) for j, p in payloads.items()]
    segments.submitted(batch)
    segments.refused(batch[2:])  # a refused job stays its client's
    segments.ended(["a"])
    assert sorted(shm.names(prefix)) == sorted(frames.segment_of(payloads[j]) for j in ("b", "c"))
    segments.ended(["b", "c", "unknown"])
    assert shm.names(prefix) == [frames.segment_of(payloads["c"])]
    shm.release(payloads["c"])


def test_a_result_is_unlinked_once_every_recipient_collected_again(prefix):
    segments = owner(prefix)
    result = Outcome("j", True, dumps_result(bytes(BIG), shm.result_name(prefix, 1)), "", None)
    segments.posted(result, 2)  # its client and one watcher
    segments.handed("c", [result])
    segments.handed("w", [result])
    segments.collecting("c")
    assert len(shm.names(prefix)) == 1  # the watcher has not collected again yet
    segments.client_gone("w")
    assert shm.names(prefix) == []


def test_a_result_nobody_collects_and_a_lost_lease_s_result_are_unlinked(prefix):
    segments = owner(prefix)
    boxes = Mailboxes(on_discard=segments.discarded)
    result = Outcome("j", True, dumps_result(bytes(BIG), shm.result_name(prefix, 1)), "", None)
    segments.posted(result, 1)
    boxes.post("gone-client", result)
    assert shm.names(prefix) == []
    dumps_result(bytes(BIG), shm.result_name(prefix, 2))
    segments.lease_lost(2)
    assert shm.names(prefix) == []


def test_a_dropped_mailbox_discards_its_outcomes_through_the_hook():
    discarded: list[Outcome] = []
    boxes = Mailboxes(on_discard=discarded.append)
    boxes.open("c")
    outcome = Outcome("j", True, b"", "", None)
    boxes.post("c", outcome)
    assert boxes.drop("c") == 1 and discarded == [outcome]


# ------------------------------------------------------------------ max_pending_bytes


def test_pending_payload_bytes_are_bounded_like_pending_jobs():
    clock = FakeClock()
    queue = JobQueue(clock=clock, max_pending_bytes=100)
    queue.submit(request("a", b"x" * 60))
    with pytest.raises(QueueFullError) as full:
        queue.submit(request("b", b"x" * 60), timeout=0)
    assert full.value.unit == "payload bytes" and "100 payload bytes" in str(full.value)
    with pytest.raises(InvalidJobError, match="can never fit"):
        queue.submit(request("c", b"x" * 101), timeout=0)
    waiter = threading.Thread(target=queue.submit, args=(request("b", b"x" * 60), None))
    waiter.start()
    clock.wait_parked(1)
    assert queue.take("w", 0) is not None  # "a" leaves the heap: "b" fits
    waiter.join(10)
    assert not waiter.is_alive() and len(queue) == 1
    assert queue.cancel("b")
    queue.submit(request("d", b"x" * 100), timeout=0)  # cancelling freed its bytes


def test_a_shared_memory_payload_counts_its_segment(prefix):
    payload = job_payload(prefix, bytes(BIG))
    queue = JobQueue(max_pending_bytes=BIG, sizer=shm.payload_size)
    with pytest.raises(InvalidJobError, match="can never fit"):
        queue.submit(request("a", payload), timeout=0)
    shm.release(payload)
