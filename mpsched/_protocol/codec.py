"""The codec of the per-job messages: records in, flat tuples on the wire, records out.

The messages sent once per job cross as flat tuples: pickling nested NamedTuples
runs Python code per record (~12 us against ~1 us flat; a JobRequest in a submit batch
2.1 us against 0.5). ServiceProxy converts on the client side, ManagerService on the
manager side; the code on both sides sees records.

A payload of BLOB bytes or more crosses as a PickleBuffer: FastConnection
(mpsched._transport.wire) sends it from its own memory and receives it into a buffer of its
own, where pickling it into the message would copy it on both sides. It arrives as a
bytearray, or as a read-only view of one (:func:`blob_in` unwraps it); the code on both sides
sees bytes-like data.

Each tuple is read back by unpacking it into named fields, never by index; the records
are then built from those names in their order (a keyword call would cost ~0.4 us a job,
on the path every job takes).
"""

from __future__ import annotations

from pickle import PickleBuffer
from typing import Any, TypeVar

from mpsched._core.job import DEFAULT_QUEUE, Assignment, JobRequest, Lease, Outcome, Payload
from mpsched._protocol.records import Report

BLOB = 1 << 16
R = TypeVar("R", JobRequest, Outcome)
Blob = bytes | bytearray | PickleBuffer | memoryview  # a payload in a wire tuple
JobRequestWire = tuple[Any, ...]  # JobRequest's fields; queue and limit only when named
AssignmentWire = tuple[
    int, str, str, int, Blob, "float | None", "float | None", float, "float | None"
]
OutcomeWire = tuple[str, bool, Blob, str, "float | None", str]
# A plain request's fields on the wire: all but ``retry``, ``queue`` and ``limit``, which
# it sends as _PLAIN_TAIL.
_PLAIN_FIELDS = len(JobRequest._fields) - 3
_PLAIN_TAIL = (None, DEFAULT_QUEUE, None)
ReportWire = tuple[int, OutcomeWire]


def blob_in(payload: Blob) -> Payload:
    """A payload as it came out of a message: bytes or a bytearray."""
    if isinstance(payload, memoryview):
        received = payload.obj  # the buffer it was received into
        assert isinstance(received, bytearray)
        return received
    assert not isinstance(payload, PickleBuffer)
    return payload


def _flat(record: JobRequest | Outcome) -> tuple[Any, ...]:
    """A record whose ``payload`` field is its only large one, as a wire tuple."""
    if len(record.payload) < BLOB:
        return tuple(record)
    return tuple(record._replace(payload=PickleBuffer(record.payload)))  # type: ignore[arg-type]


def _received(record: R) -> R:
    """A record made of a wire tuple, its payload unwrapped by :func:`blob_in`."""
    if type(record.payload) is bytes:
        return record
    return record._replace(payload=blob_in(record.payload))


def request_to_wire(r: JobRequest) -> JobRequestWire:
    """``r`` as sent: a request that uses neither retries, nor a named queue, nor a limit
    crosses without its last three fields (the plain path pays no byte for them)."""
    if r.retry is None and r.queue == DEFAULT_QUEUE and r.limit is None:
        if len(r.payload) < BLOB:
            return r[:-3]
        return tuple(r._replace(payload=PickleBuffer(r.payload)))[:-3]  # type: ignore
    return _flat(r)


def request_from_wire(w: JobRequestWire) -> JobRequest:
    return _received(JobRequest._make(w + _PLAIN_TAIL if len(w) == _PLAIN_FIELDS else w))


def assignment_to_wire(
    a: Assignment, delay: float, remote_payload: Payload | None = None
) -> AssignmentWire:
    """``a`` as sent, ``delay`` seconds before it is due; with ``remote_payload``, as sent
    to a worker on another clock: that payload instead, and neither its due instant nor
    its wall-clock time."""
    payload = a.payload if remote_payload is None else remote_payload
    lease_id, job_id, worker_id, attempt = a.lease
    local = remote_payload is None
    return (
        lease_id,
        job_id,
        worker_id,
        attempt,
        payload if len(payload) < BLOB else PickleBuffer(payload),
        a.due if local else None,
        a.timeout,
        delay,
        a.at if local else None,
    )


def assignment_from_wire(w: AssignmentWire) -> Assignment:
    lease_id, job_id, worker_id, attempt, payload, due, timeout, delay, at = w
    return Assignment(
        Lease(lease_id, job_id, worker_id, attempt),
        payload if type(payload) is bytes else blob_in(payload),
        due,
        timeout,
        delay,
        at,
    )


def outcome_to_wire(o: Outcome) -> OutcomeWire:
    return _flat(o)


def outcome_from_wire(w: OutcomeWire) -> Outcome:
    return _received(Outcome._make(w))


def report_to_wire(r: Report) -> ReportWire:
    return (r.lease_id, outcome_to_wire(r.outcome))


def report_from_wire(w: ReportWire) -> Report:
    lease_id, outcome = w
    return Report(lease_id, outcome_from_wire(outcome))
