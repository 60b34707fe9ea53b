"""The Lua scripts of a Redis store (``lua/``), called by name; the argument lists they
take and the replies they give, in Python.

Each script is ``common.lua`` followed by its own file. How they are called (by SHA, each
thread on a connection of its own) is :mod:`mpsched._store.redis.script_runner`'s part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpsched._core.job import DEFAULT_QUEUE, After, JobState, Order
from mpsched._store.redis.records import (
    Beat,
    Claimed,
    Finish,
    Held,
    NewJob,
    Reply,
    Requeue,
    StoredEnd,
    Take,
    TakenBack,
    Withdrawn,
)
from mpsched._store.redis.script_runner import ScriptRunner

US = 1_000_000  # microseconds per second
# The bound a submit found reached (submit.lua's `full`), as QueueFullError names it.
FULL = {1: "jobs", 2: "payload bytes"}


def _us(seconds: float) -> int:
    return round(seconds * US)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt(value: Any) -> str | None:
    return None if value is None or value == b"" else _text(value)


class Scripts:
    """The scripts, registered on ``client``, called with the deployment's key base.

    ``ttl`` and ``keep`` are this manager's result_ttl and the least time an ended job
    named in another manager's inbox is kept (seconds); ``order`` the order its claims
    follow (the store's: see :meth:`heartbeat`).
    """

    def __init__(
        self, client: Any, base: str, *, ttl: float, keep: float, order: Order = Order.TIME
    ) -> None:
        # Read by every claim, replaced by the heartbeat thread when the store's order is
        # another (one reference, swapped whole: no lock).
        self.order = order
        self._ttl_ms = str(_us(ttl) // 1000)
        self._keep_ms = str(_us(keep) // 1000)
        self._runner = ScriptRunner(client, base)

    def reset(self) -> None:
        """Close every thread's connection: ``ScriptRunner.reset``."""
        self._runner.reset()

    def close(self) -> None:
        """Close every thread's connection."""
        self._runner.close()

    def submit(
        self,
        jobs: Sequence[NewJob],
        owner: str,
        *,
        if_absent: bool,
        max_pending: int | None,
        max_pending_bytes: int | None,
        again: bool = False,
    ) -> tuple[list[str], str | None]:
        mode = "2" if again else "1" if if_absent else "0"
        args: list[Any] = [
            owner,
            mode,
            "" if max_pending is None else max_pending,
            "" if max_pending_bytes is None else max_pending_bytes,
            len(jobs),
        ]
        for job in jobs:
            args += [
                job.job_id,
                job.client_id,
                job.key or "",
                job.name,
                _blob(job.payload),
                job.priority,
                "" if job.delay is None else _us(job.delay),
                "" if job.at is None else _us(job.at),
                "" if job.timeout is None else repr(float(job.timeout)),
                job.retries,
            ]
        held = [k for k, job in enumerate(jobs, 1) if job.held]
        args += [len(held), *held]
        retry = [(k, job.retry) for k, job in enumerate(jobs, 1) if job.retry is not None]
        routed = [
            (k, job.queue, job.limit or "")
            for k, job in enumerate(jobs, 1)
            if job.queue != DEFAULT_QUEUE or job.limit is not None
        ]
        if retry or routed:  # only then: a plain batch sends nothing for them
            args.append(len(retry))
            for k, state in retry:
                args += [k, state]
        if routed:
            args.append(len(routed))
            for route in routed:
                args += route
        holders, full = self._runner.call("submit", *args)
        return [_text(h) for h in holders], FULL.get(full)

    def submit_after(self, jobs: Sequence[NewJob], afters: Sequence[After], owner: str) -> None:
        args: list[Any] = [owner, self._ttl_ms, self._keep_ms, len(jobs)]
        for job, after in zip(jobs, afters, strict=True):
            args += [
                job.job_id,
                job.client_id,
                job.name,
                _blob(job.payload),
                job.priority,
                "" if job.delay is None else _us(job.delay),
                "" if job.at is None else _us(job.at),
                "" if job.timeout is None else repr(float(job.timeout)),
                job.retries,
                "1" if after.allow_failure else "0",
                job.retry or "",
                len(after.parents),
                *after.parents,
                len(after.results),
                *after.results,
            ]
        self._runner.call("after", *args)

    def claim(
        self,
        me: str,
        lease: float,
        finishes: Sequence[Finish],
        requeues: Sequence[Requeue],
        take: Take,
        *,
        span: float,
        grace: float,
        answers: Sequence[str] = (),
    ) -> Reply:
        args: list[Any] = [me, _us(lease) // 1000, self._ttl_ms, self._keep_ms, len(finishes)]
        for f in finishes:
            state = f.state.value if f.retry is None else f"{f.state.value}\n{f.retry}"
            args += [f.job_id, f.token, state, _blob(f.outcome)]
        args.append(len(requeues))
        for r in requeues:
            args += [r.job_id, r.token, "1" if r.retry else "0"]
        args += [len(answers), *answers]
        args += [
            take.want,
            take.worker,
            _us(take.early),
            _us(span) // 1000,
            _us(grace) // 1000,
            take.lead,
            "1" if take.waiting else "0",
            len(take.ids),
            *take.ids,
            len(take.queues),
            *take.queues,
            take.claim,
            self.order.value,
        ]
        finished, requeued, jobs, head_us, leader, leader_ms, registered = self._runner.call(
            "claim", *args
        )
        return Reply(
            finished=[int(x) for x in finished],
            requeued=[int(x) for x in requeued],
            jobs=[_claimed(job) for job in jobs],
            head_in=None if head_us == -1 else head_us / US,
            leader=bool(leader),
            leader_left=None if leader_ms < 0 else leader_ms / 1000,
            registered=bool(registered),
        )

    def cancel(
        self,
        me: str,
        job_ids: Sequence[str],
        client_id: str = "",
        not_due_only: bool = False,
        *,
        nonce: str = "",
        settle: bool = False,
    ) -> tuple[list[Withdrawn], list[Held]]:
        rows = self._runner.call(
            "cancel",
            me,
            self._ttl_ms,
            self._keep_ms,
            client_id,
            "1" if not_due_only else "0",
            "settle" if settle else "",
            nonce,
            *job_ids,
        )
        return (
            [
                Withdrawn(job_id=_text(row[0]), client_id=_text(row[1]), mine=row[2] == 1)
                for row in rows
                if row[2] != 2
            ],
            [
                Held(job_id=_text(row[0]), client_id=_text(row[1]), holder=_text(row[3]))
                for row in rows
                if row[2] == 2
            ],
        )

    def watch(self, me: str, job_id: str) -> StoredEnd | None:
        row = self._runner.call("watch", me, job_id)
        if not row:
            return None
        state, outcome, crashed, client = row
        return StoredEnd(
            job_id=job_id,
            state=JobState(_text(state)),
            outcome=outcome,
            crashed_worker=_opt(crashed),
            client_id=_text(client),
            owner="",
        )

    def drain(self, me: str, count: int, done: int = 0) -> list[StoredEnd]:
        return [
            StoredEnd(
                job_id=_text(i),
                state=None if not s else JobState(_text(s)),
                outcome=o,
                crashed_worker=_opt(x),
                client_id=_opt(c) or "",
                owner=_opt(w) or "",
            )
            for i, s, o, x, c, w in self._runner.call("drain", me, count, done)
        ]

    def heartbeat(self, me: str, lease: float, status: bytes, *, join: bool = False) -> Beat:
        before, reaped, failed, requeued, next_ms, order, taken = self._runner.call(
            "heartbeat",
            me,
            _us(lease) // 1000,
            self._ttl_ms,
            self._keep_ms,
            status,
            self.order.value,
            "1" if join else "0",
        )
        return Beat(
            registered_before=bool(before),
            reaped=[_text(m) for m in reaped],
            taken_back=[
                TakenBack(
                    manager=_text(m), lease_timeout=int(ms) / 1000, requeued=int(r), failed=int(f)
                )
                for m, ms, r, f in taken
            ],
            failed=[(_text(i), _text(w), _text(c), bool(m)) for i, w, c, m in failed],
            requeued=int(requeued),
            next_expiry=None if next_ms < 0 else next_ms / 1000,
            order=Order(_text(order)),
        )

    def leave(self, me: str) -> int:
        return int(self._runner.call("leave", me, self._ttl_ms, self._keep_ms))

    def unclaim(self, me: str, claims: Sequence[str]) -> list[str]:
        return [
            _text(i) for i in self._runner.call("unclaim", me, self._ttl_ms, self._keep_ms, *claims)
        ]

    def jobs(self, state: JobState | None, limit: int | None) -> list[list[Any]]:
        return list(self._runner.call("jobs", "" if state is None else state.value, limit or 0))

    def prune(self, count: int) -> int:
        return int(self._runner.call("prune", count))

    def requeue(self, me: str, job_id: str, client_id: str) -> int | str:
        """1 or 2 (it became the head) when the job was put back, else why not (requeue.lua)."""
        reply = self._runner.call("requeue", me, job_id, client_id)
        return reply if isinstance(reply, int) else _text(reply)

    def progress(self, updates: Sequence[tuple[str, str, str]]) -> int:
        return int(self._runner.call("progress", *(part for update in updates for part in update)))

    def set_limit(self, name: str, bounds: str) -> None:
        self._runner.call("limit", name, bounds)


def _claimed(row: list[Any]) -> Claimed:
    (
        job_id,
        payload,
        delay_us,
        timeout,
        attempt,
        token,
        level,
        seq,
        client,
        owner,
        retries,
        key,
        name,
        due_us,
        submitted_us,
        *extra,
    ) = row  # [retry[, inputs]] (claim.lua)
    retry = extra[0] if extra else None  # a job with a retry policy
    inputs = extra[1] if len(extra) > 1 else None  # a job whose ResultOf take results
    return Claimed(
        job_id=_text(job_id),
        payload=payload,
        delay=int(delay_us) / US,
        timeout=None if not timeout else float(timeout),
        attempt=int(attempt),
        token=_text(token),
        priority=int(level),
        seq=int(seq),
        client_id=_text(client),
        owner=_text(owner),
        retries=int(retries),
        key=_opt(key),
        name=_text(name),
        due_wall=int(due_us) / US,
        submitted_wall=int(submitted_us) / US,
        retry=_text(retry) if retry else None,
        inputs=None if inputs is None else [(_text(i), _text(st), out) for i, st, out in inputs],
    )


def parse_ended(message: bytes) -> list[StoredEnd] | None:
    """The ends of jobs as the scripts publish them on a manager's channel, one or more
    (``ended_message`` and ``send_outbox`` in common.lua); None for any other message (an
    inbox that has ids to drain, a cancel's request)."""
    if not message.startswith(b"E"):
        return None
    fields: list[bytes] = []
    at = 1
    while at < len(message):
        colon = message.index(b":", at)
        size = int(message[at:colon])
        fields.append(message[colon + 1 : colon + 1 + size])
        at = colon + 1 + size
    return [
        StoredEnd(
            job_id=job_id.decode(),
            state=JobState(state.decode()),
            outcome=outcome or None,
            crashed_worker=crashed.decode() or None,
            client_id=client.decode(),
            owner="",
        )
        for job_id, state, client, crashed, outcome in zip(*[iter(fields)] * 5, strict=True)
    ]


def parse_cancel_request(message: bytes) -> tuple[str, list[str]] | None:
    """A cancel's request to give back prefetched jobs (cancel.lua: "C" nonce " " ids):
    its nonce and the job ids; None for any other message."""
    if not message.startswith(b"C"):
        return None
    nonce, *job_ids = message[1:].decode().split(" ")
    return nonce, job_ids


def _blob(data: bytes | bytearray | memoryview) -> bytes:
    """A payload or outcome as a script argument: bytes. A large one arrives from a
    connection as a bytearray (mpsched._protocol.codec.blob_in), which the Redis client's
    command packer refuses; copied once here."""
    return data if type(data) is bytes else bytes(data)
