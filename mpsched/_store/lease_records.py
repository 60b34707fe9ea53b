"""The records of the lease log (mpsched._store.lease_log): what each says, and its bytes.

Each record carries the job's state after the change: running on a worker as attempt A,
pending after A attempts, or ended (done or failed, when, and the outcome it has, if it
is short enough). On disk: a head (CRC32 of the body, its length), then the body (the log's
epoch, the record's ticket, attempt, kind, the job id, then the worker id, or the end and
its outcome). Reading gathers runs: from the start of a region, records while they are
whole, pass their CRC32, keep one epoch and their tickets rise.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from mpsched._core.job import JobState

# The longest outcome a finish record carries (bytes of the store's encoding): a result
# that big costs a 32 KiB copy, ~4 of them fill a region; a longer one waits for SQLite.
OUTCOME_IN_LOG = 32 << 10

_HEAD = struct.Struct("<IH")  # CRC32 of the body, body length
# epoch, ticket, attempt, kind (_PENDING, _RUNNING or _ENDED), job id length; then the job
# id, and then: the worker id (running), or _END and the outcome if it has one (ended).
_BODY = struct.Struct("<QQIBH")
_STAMP = struct.Struct("<QQ")  # the body's start: epoch, ticket (written under the lock)
_FIELDS = struct.Struct("<IBH")  # the rest of _BODY: attempt, kind, job id length
_END = struct.Struct("<dBB")  # finished_wall, failed (0/1), outcome follows (0/1)
_PENDING, _RUNNING, _ENDED = 0, 1, 2


class LogRecord(NamedTuple):
    """A job's state after a lease (running), a requeue (pending) or its end (ended)."""

    job_id: str
    running: bool
    attempt: int
    worker_id: str | None  # the worker it is leased to; None when pending or ended
    ended: JobState | None = None  # DONE or FAILED for an end, else None
    finished_wall: float = 0.0  # when it ended (epoch seconds)
    outcome: bytes | None = None  # an end's outcome, if the record carries it


def leased(job_id: str, worker_id: str, attempt: int) -> LogRecord:
    """The record of a job handed to ``worker_id`` as its attempt ``attempt``."""
    return LogRecord(job_id=job_id, running=True, attempt=attempt, worker_id=worker_id)


def requeued(job_id: str, attempt: int) -> LogRecord:
    """The record of a job pending again after ``attempt`` attempts."""
    return LogRecord(job_id=job_id, running=False, attempt=attempt, worker_id=None)


def ended(job_id: str, state: JobState, finished_wall: float, outcome: bytes | None) -> LogRecord:
    """The record of a job's end (``state`` DONE or FAILED); it carries ``outcome`` only if
    that is at most OUTCOME_IN_LOG bytes."""
    kept = outcome if outcome is not None and len(outcome) <= OUTCOME_IN_LOG else None
    return LogRecord(
        job_id=job_id,
        running=False,
        attempt=0,
        worker_id=None,
        ended=state,
        finished_wall=finished_wall,
        outcome=kept,
    )


def encode(record: LogRecord) -> bytes:
    """``record``'s body after its stamp (the log's epoch, the record's ticket): what can be
    encoded before the log's lock is taken."""
    job_id = record.job_id.encode()
    kind = _ENDED if record.ended is not None else _RUNNING if record.running else _PENDING
    return _FIELDS.pack(record.attempt, kind, len(job_id)) + job_id + _encode_rest(record)


def frame(epoch: int, ticket: int, encoded: bytes) -> bytes:
    """The bytes of a record (``encoded`` by :func:`encode`) as the log holds it."""
    body = _STAMP.pack(epoch, ticket) + encoded
    return _HEAD.pack(zlib.crc32(body), len(body)) + body


def _encode_rest(record: LogRecord) -> bytes:
    """What follows the job id in a record's body."""
    if record.ended is not None:
        outcome = record.outcome
        return _END.pack(
            record.finished_wall, record.ended is JobState.FAILED, outcome is not None
        ) + (outcome or b"")
    return (record.worker_id or "").encode() if record.running else b""


def _decode(job_id: str, attempt: int, kind: int, rest: bytes) -> LogRecord | None:
    """A record from its fields and what follows its job id; None if they do not make one."""
    if kind == _RUNNING:
        return leased(job_id, rest.decode(), attempt)
    if kind == _PENDING:
        return requeued(job_id, attempt)
    if kind != _ENDED or len(rest) < _END.size:
        return None
    finished_wall, failed, has_outcome = _END.unpack_from(rest)
    return LogRecord(
        job_id=job_id,
        running=False,
        attempt=attempt,
        worker_id=None,
        ended=JobState.FAILED if failed else JobState.DONE,
        finished_wall=finished_wall,
        outcome=rest[_END.size :] if has_outcome else None,
    )


def latest(records: list[LogRecord]) -> dict[str, LogRecord]:
    """The last record of each job in ``records`` (oldest first): the job's state."""
    return {record.job_id: record for record in records}


def split(records: list[LogRecord]) -> tuple[dict[str, LogRecord], dict[str, LogRecord]]:
    """The last lease or requeue of each job, and the end of each job that has one. A
    move after a job's end (a failed or cancelled job requeued by id) undoes that end."""
    moves = latest([record for record in records if record.ended is None])
    ends: dict[str, LogRecord] = {}
    for record in records:
        if record.ended is not None:
            ends[record.job_id] = record
        elif ends and record.job_id in ends:
            del ends[record.job_id]
    return moves, ends


def read_run(data: bytes, at: int, end: int) -> list[tuple[int, int, LogRecord]]:
    """The records (epoch, ticket, record) from offset ``at`` to ``end`` (a region) while
    they are whole, pass their CRC32, keep one epoch and their tickets rise."""
    run: list[tuple[int, int, LogRecord]] = []
    end = min(end, len(data))
    while at + _HEAD.size <= end:
        crc, length = _HEAD.unpack_from(data, at)
        body = data[at + _HEAD.size : min(at + _HEAD.size + length, end)]
        if length < _BODY.size or len(body) < length or zlib.crc32(body) != crc:
            break
        epoch, ticket, attempt, kind, id_len = _BODY.unpack_from(body)
        if (run and (epoch != run[-1][0] or ticket <= run[-1][1])) or _BODY.size + id_len > length:
            break
        job_id = body[_BODY.size : _BODY.size + id_len].decode()
        record = _decode(job_id, attempt, kind, body[_BODY.size + id_len :])
        if record is None:
            break
        run.append((epoch, ticket, record))
        at += _HEAD.size + length
    return run
