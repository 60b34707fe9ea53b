"""The Lua scripts of a Redis store (``lua/``), called by name; the argument lists they
take and the replies they give, in Python.

Each script is ``common.lua`` followed by its own file, called by its SHA (EVALSHA) and
loaded again when the server has forgotten it (a restart). Every thread calls them on a
connection of its own, straight through redis-py's connection (a command out, a reply in):
its client's pool, retry and reply-callback layers cost more CPU than the call itself, on
the path every job takes. Those connections are made from the pool's settings but are
not the pool's: a pool counts the connections it made and refuses more past its cap,
and one lost here is never given back to it.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from collections.abc import Sequence
from importlib import resources
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

NAMES = (
    "submit",
    "claim",
    "cancel",
    "watch",
    "drain",
    "heartbeat",
    "leave",
    "jobs",
    "prune",
    "unclaim",
    "progress",
    "requeue",
    "limit",
    "after",
)
US = 1_000_000  # microseconds per second
# The bound a submit found reached (submit.lua's `full`), as QueueFullError names it.
FULL = {1: "jobs", 2: "payload bytes"}


class Unanswered(Exception):
    """A script went out whole and its answer did not come (a timeout, or the connection
    lost on the way back): the server may have run it, or may run it yet. ``cause`` is
    redis-py's error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def source(name: str) -> str:
    """The text of script ``name``: the shared helpers, then the script."""
    folder = resources.files("mpsched._store.redis").joinpath("lua")
    return folder.joinpath("common.lua").read_text() + folder.joinpath(f"{name}.lua").read_text()


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
        self._base = base
        # Read by every claim, replaced by the heartbeat thread when the store's order is
        # another (one reference, swapped whole: no lock).
        self.order = order
        self._due_key = base + "due"  # every key shares its hash slot
        self._ttl_ms = str(_us(ttl) // 1000)
        self._keep_ms = str(_us(keep) // 1000)
        self._sources = {name: source(name) for name in NAMES}
        self._shas = {
            name: hashlib.sha1(text.encode()).hexdigest() for name, text in self._sources.items()
        }
        self._pool = client.connection_pool
        errors = importlib.import_module("redis").exceptions
        self._no_script = errors.NoScriptError
        self._lost = (errors.ConnectionError, errors.TimeoutError, OSError)
        self._timeout = errors.TimeoutError
        # Each thread's own connection (made on its first call), and all of them, so that
        # close() can end them; the list is guarded by _lock (nobody waits on it).
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Any] = []

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._pool.connection_class(**self._pool.connection_kwargs)
            with self._lock:
                self._connections.append(conn)
        return conn

    def _lose(self, conn: Any) -> None:
        """Close a connection that failed; the thread's next call makes another."""
        conn.disconnect()
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def _call(self, name: str, *args: Any) -> Any:
        """Run script ``name``; Unanswered when it went out and no answer came (it may
        have run); redis-py's error when it did not go out (it did not run)."""
        conn = self._connection()
        command = ("EVALSHA", self._shas[name], 1, self._due_key, self._base, *args)
        sent = False
        try:
            conn.send_command(*command)
            sent = True
            try:
                return conn.read_response()
            except self._no_script:  # the server restarted since: load it, call it again
                sent = False
                conn.send_command("SCRIPT", "LOAD", self._sources[name])
                conn.read_response()
                conn.send_command(*command)
                sent = True
                return conn.read_response()
        except self._lost as exc:
            self._lose(conn)
            if not isinstance(exc, self._timeout):
                self.reset()  # the server went away: every other connection is stale
            if sent:
                raise Unanswered(exc) from exc
            raise

    def reset(self) -> None:
        """Close every thread's connection; each thread's next call opens another (a
        restarted server answers none of the old ones)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.disconnect()

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.disconnect()

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
        holders, full = self._call("submit", *args)
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
        self._call("after", *args)

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
        finished, requeued, jobs, head_us, leader, leader_ms, registered = self._call(
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
        rows = self._call(
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
        row = self._call("watch", me, job_id)
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
            for i, s, o, x, c, w in self._call("drain", me, count, done)
        ]

    def heartbeat(self, me: str, lease: float, status: bytes, *, join: bool = False) -> Beat:
        before, reaped, failed, requeued, next_ms, order, taken = self._call(
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
        return int(self._call("leave", me, self._ttl_ms, self._keep_ms))

    def unclaim(self, me: str, claims: Sequence[str]) -> list[str]:
        return [_text(i) for i in self._call("unclaim", me, self._ttl_ms, self._keep_ms, *claims)]

    def jobs(self, state: JobState | None, limit: int | None) -> list[list[Any]]:
        return list(self._call("jobs", "" if state is None else state.value, limit or 0))

    def prune(self, count: int) -> int:
        return int(self._call("prune", count))

    def requeue(self, me: str, job_id: str, client_id: str) -> int | str:
        """1 or 2 (it became the head) when the job was put back, else why not (requeue.lua)."""
        reply = self._call("requeue", me, job_id, client_id)
        return reply if isinstance(reply, int) else _text(reply)

    def progress(self, updates: Sequence[tuple[str, str, str]]) -> int:
        return int(self._call("progress", *(part for update in updates for part in update)))

    def set_limit(self, name: str, bounds: str) -> None:
        self._call("limit", name, bounds)


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
