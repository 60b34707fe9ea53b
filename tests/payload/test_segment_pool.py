"""A client's reusable segments (mpsched._payload.segment_pool) and the manager's side of them."""

from __future__ import annotations

import os

import jobs
import pytest

from mpsched._core.job import JobRequest
from mpsched._payload import frames, shm
from mpsched._payload import segment_pool as _segment_pool
from mpsched._payload.pickling import loads, pickle_job
from mpsched._payload.segment_pool import SegmentPool
from mpsched._payload.segments import Segments

BIG = 2 * shm.THRESHOLD


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def segment(payload: bytes) -> str:
    return frames.segment_of(payload)


def test_a_returned_segment_carries_the_next_job_of_its_size(prefix):
    pool = SegmentPool(prefix, "c1")
    first = pickle_job(jobs.noop, (os.urandom(BIG),), {}, pool=pool)
    name = pool.pooled(first)
    assert name.startswith(shm.pool_stem(prefix, "c1"))
    assert shm.pool_owner(prefix, name) == "c1"
    pool.returned(name)
    data = os.urandom(BIG - 100)  # another size of the same class
    second = pickle_job(jobs.noop, (data,), {}, pool=pool)
    assert pool.pooled(second) == name and loads(second)[1] == (data,)
    other = pickle_job(jobs.noop, (os.urandom(4 * BIG),), {}, pool=pool)
    assert pool.pooled(other) not in ("", name)  # a larger class: a segment of its own
    pool.returned(pool.pooled(other))
    pool.returned(name)
    pool.close()
    assert shm.names(prefix) == []


def test_writable_or_large_buffers_get_a_segment_of_their_own(prefix):
    pool = SegmentPool(prefix, "c1", max_size=BIG)
    mutable = pickle_job(jobs.noop, (bytearray(BIG),), {}, pool=pool)
    assert segment(mutable).startswith(prefix + "j") and pool.pooled(mutable) == ""
    large = pickle_job(jobs.noop, (bytes(BIG + 1),), {}, pool=pool)
    assert segment(large) and pool.pooled(large) == ""
    shm.release(mutable)
    shm.release(large)


def test_free_segments_are_unlinked_when_idle_when_too_many_and_at_close(prefix, monkeypatch):
    clock = Clock()
    pool = SegmentPool(prefix, "c1", clock=clock)
    names = [pool.pooled(pickle_job(jobs.noop, (bytes(BIG),), {}, pool=pool)) for _ in range(3)]
    monkeypatch.setattr(_segment_pool, "MAX_FREE", 2 * BIG)
    for name in names:
        pool.returned(name)
    assert sorted(pool.free_names()) == sorted(names[:2])  # the third was over the cap
    assert sorted(shm.names(prefix)) == sorted(names[:2])
    assert pool.trim() == _segment_pool.IDLE
    clock.now += _segment_pool.IDLE / 2
    pool.returned(pool.pooled(pickle_job(jobs.noop, (bytes(BIG),), {}, pool=pool)))
    clock.now += _segment_pool.IDLE / 2
    assert pool.trim() == pytest.approx(_segment_pool.IDLE / 2)  # the one used since stays
    assert len(pool.free_names()) == 1 and len(shm.names(prefix)) == 1
    held = pool.pooled(pickle_job(jobs.noop, (bytes(BIG),), {}, pool=pool))
    pool.close()
    assert shm.names(prefix) == [held]  # its job's: the manager's to unlink
    pool.returned(held)  # its job ended after the client closed
    assert shm.names(prefix) == []


def test_a_segment_removed_under_the_pool_is_replaced(prefix):
    pool = SegmentPool(prefix, "c1")
    name = pool.pooled(pickle_job(jobs.noop, (bytes(BIG),), {}, pool=pool))
    pool.returned(name)
    shm.unlink(name)  # as the manager does for a client it believes gone
    payload = pickle_job(jobs.noop, (b"\x05" * BIG,), {}, pool=pool)
    assert pool.pooled(payload) not in ("", name)
    assert loads(payload)[1] == (b"\x05" * BIG,)
    pool.discard(pool.pooled(payload))
    pool.close()


def request(job_id: str, client_id: str, payload: bytes) -> JobRequest:
    return JobRequest(job_id, client_id, payload, 2, 0.0, None)


def test_the_manager_leaves_an_ended_job_s_reusable_segment_to_its_client(prefix):
    segments = Segments(prefix, b"")
    pool = SegmentPool(prefix, "c1")
    payloads = [pickle_job(jobs.noop, (bytes(BIG),), {}, pool=pool) for _ in range(4)]
    segments.submitted([request(str(i), "c1", p) for i, p in enumerate(payloads)])
    segments.ended(["0"])
    assert len(shm.names(prefix)) == 4  # the client's again: it reuses it
    pool.returned(pool.pooled(payloads[0]))  # free in the client's pool
    segments.ended(["1"])  # ended, but the client never heard of it (it went away)
    segments.client_gone("c1")
    # Free or forgotten ones are removed; those of jobs still queued stay for them.
    assert sorted(shm.names(prefix)) == sorted(segment(p) for p in payloads[2:])
    segments.ended(["2", "3"])  # the client is gone: nobody will reuse them
    assert shm.names(prefix) == []
