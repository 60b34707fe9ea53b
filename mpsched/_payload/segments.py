"""Who unlinks each shared-memory segment, in the manager (see mpsched._payload.shm).

Exactly one owner unlinks a segment:

- a job's arguments: the client that wrote them until its submit call returns (it
  unlinks them when the job is refused, withdrawn or never sent), then the manager, which
  unlinks them once the job's outcome is final (done, failed, timed out, out of retries),
  or when it is cancelled or not queued (its key was held). A requeued job keeps them;
- a client's reusable segment (mpsched._payload.segment_pool): the same, except that when its
  job ends while the client is connected, the manager leaves it to the client (which
  learns of the end from the outcome or its cancel). When the client goes away, the
  manager unlinks its reusable segments that no job holds, and the rest as their jobs end;
- a result: the manager, from the worker's report until every client it was posted to
  has collected it and called ``collect`` again (its result thread maps what it collected
  before calling again), or its mailbox was dropped. A result written by a worker that
  died before reporting it is unlinked with its lost lease (its name is the lease's);
- anything left: the manager, which removes every segment of its prefix when it stops,
  and the segments of stopped managers when it starts (mpsched._payload.shm.sweep_dead_managers).

The manager reads no segment (it learns names from payload frames), except to hand a job to
a worker that joined from elsewhere (that one gets the buffers inline), and with a Redis
store, which must hold every payload whole (any manager may run a job, and this one may
die): a job's arguments once, at its submit (:meth:`Segments.for_store`), and a result once,
for the store. The manager keeps the job's segment and its framed payload while the job
is pending or running, so that its own claims take the job without its payload and hand
its workers the frame (mpsched._manager.shared_payloads); the segment is unlinked when
the job ends wherever it ran (its end comes to this manager, which serves its client).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Iterable

from mpsched._core.job import JobRequest, Outcome, Payload, PayloadOptions
from mpsched._core.result_of import job_payload
from mpsched._payload import frames, shm

log = logging.getLogger("mpsched.manager")


class Segments:
    """The segments one manager owns. With an empty ``prefix`` shared memory is off and
    every method is a no-op."""

    def __init__(self, prefix: str = "", probe: bytes = b"") -> None:
        self.prefix = prefix
        self.probe = probe
        # Guards the five tables below. Server threads take it briefly; nobody waits on it.
        self._lock = threading.Lock()
        self._jobs: dict[str, str] = {}  # job id -> its arguments' segment
        # Job id -> its framed payload, for the jobs whose store holds them inline
        # (for_store): this manager's workers get the frame, which names the segment.
        self._framed: dict[str, Payload] = {}
        # Clients whose reusable segments go back to them when a job ends (connected ones).
        self._pool_clients: set[str] = set()
        self._results: dict[str, int] = {}  # result segment -> clients yet to collect it
        self._handed: dict[str, list[str]] = {}  # client id -> segments of its last collect

    @classmethod
    def start(cls, enabled: bool, why_not: str = "") -> Segments:
        """At manager start: remove what stopped managers left, and (when ``enabled``)
        set up this manager's prefix and its probe segment. ``why_not`` is logged once
        when shared memory is not used."""
        if not shm.available():
            shm.log_fallback("this platform has no POSIX shared memory (/dev/shm)")
            return cls()
        shm.sweep_dead_managers()
        if not enabled:
            shm.log_fallback(why_not)
            return cls()
        prefix = shm.manager_prefix(os.getpid())
        probe = secrets.token_bytes(16)
        if shm.write(prefix + "probe", [memoryview(probe)]) is None:
            return cls()
        return cls(prefix, probe)

    def options(
        self, max_pending_bytes: int | None, max_payload: int | None = None
    ) -> PayloadOptions:
        return PayloadOptions(
            prefix=self.prefix,
            probe=self.probe,
            max_pending_bytes=max_pending_bytes,
            max_payload=max_payload,
        )

    def close(self) -> None:
        """The manager stops: unlink every segment of its prefix."""
        if self.prefix:
            removed = shm.sweep(self.prefix)
            log.debug("removed %d shared-memory segment(s) at stop", removed)

    # ------------------------------------------------------------------ job arguments

    def submitted(self, requests: list[JobRequest]) -> None:
        """Take ownership of a batch's segments (before its jobs can be taken)."""
        if not self.prefix:
            return
        owned = [(r.job_id, s) for r in requests if (s := frames.segment_of(r.payload))]
        if owned:
            pooling = {c for _, s in owned if (c := shm.pool_owner(self.prefix, s))}
            with self._lock:
                self._jobs.update(owned)
                self._pool_clients |= pooling

    def for_store(self, requests: list[JobRequest]) -> tuple[list[JobRequest], set[str]]:
        """A batch (taken by :meth:`submitted`) as a store that must hold every payload
        whole takes it: each job with a segment carries its buffers inline (read once,
        here), and its framed payload is kept for :meth:`held_payload` until the job
        ends. Returns the batch and the ids of the jobs whose segments this manager
        keeps; jobs without a segment are passed on as they are, at no cost.

        Raises:
            OSError: a segment could not be read (the caller refuses the batch).
        """
        if not self.prefix:
            return requests, set()
        held = {r.job_id: r.payload for r in requests if frames.segment_of(r.payload)}
        if not held:
            return requests, set()
        stored = [
            r._replace(payload=shm.inline(r.payload)) if r.job_id in held else r for r in requests
        ]
        with self._lock:
            self._framed.update(held)
        return stored, set(held)

    def held_payload(self, job_id: str) -> Payload | None:
        """The framed payload of a job :meth:`for_store` took (None for another): what
        this manager's workers get instead of the inline payload the store holds."""
        with self._lock:
            return self._framed.get(job_id)

    def refused(self, requests: list[JobRequest]) -> None:
        """A batch's submit failed: its client keeps (and unlinks) its segments."""
        if self.prefix and self._jobs:
            with self._lock:
                for request in requests:
                    self._jobs.pop(request.job_id, None)
                    self._framed.pop(request.job_id, None)

    def ended(self, job_ids: Iterable[str]) -> None:
        """These jobs will never run again (final outcome, cancelled, not queued)."""
        if not self.prefix or not self._jobs:
            return
        with self._lock:
            found = []
            for job_id in job_ids:
                segment = self._jobs.pop(job_id, None)
                if segment:
                    found.append(segment)
                    self._framed.pop(job_id, None)
            # A reusable segment of a connected client is that client's again.
            done = [s for s in found if shm.pool_owner(self.prefix, s) not in self._pool_clients]
        for segment in done:
            shm.unlink(segment)

    def for_remote(self, payload: Payload) -> Payload:
        """``payload`` for a worker that may not map this host's shared memory (one that
        joined with ``worker --connect``): its segment's buffers travel inline. The only
        place the manager reads a segment; the segment stays the job's (a retry may go to
        a local worker)."""
        if not self.prefix:
            return payload
        inner = job_payload(payload)  # a job after others: its parents' outcomes first
        try:
            if inner is not payload:
                return payload[: len(payload) - len(inner)] + shm.inline(inner)
            return shm.inline(payload)
        except OSError as exc:  # gone: the worker will fail the job with the same error
            log.warning(
                "cannot read the arguments of a job in %s: %s", frames.segment_of(payload), exc
            )
            return payload

    # ----------------------------------------------------------------------- results

    def result_name(self, lease_id: int) -> str:
        """Where a local worker writes the large buffers of a lease's result."""
        return shm.result_name(self.prefix, lease_id)

    def lease_lost(self, lease_id: int) -> None:
        """A lease ended without a report: a result its worker wrote is nobody's."""
        if self.prefix:
            shm.unlink(self.result_name(lease_id))

    def discarded(self, outcome: Outcome) -> None:
        """An outcome nobody will collect (late report, or its client is gone)."""
        segment = frames.segment_of(outcome.payload) if self.prefix else ""
        if not segment:
            return
        with self._lock:
            left = self._results.pop(segment, 1) - 1
            if left > 0:
                self._results[segment] = left
        if left <= 0:
            shm.unlink(segment)

    def posted(self, outcome: Outcome, recipients: int) -> None:
        """An outcome is posted to ``recipients`` mailboxes."""
        segment = frames.segment_of(outcome.payload) if self.prefix else ""
        if segment:
            with self._lock:
                self._results[segment] = recipients

    def collecting(self, client_id: str) -> None:
        """``client_id`` calls collect again: it has mapped what it collected before."""
        if self.prefix and client_id in self._handed:
            self._release(self._handed_to(client_id))

    def handed(self, client_id: str, outcomes: list[Outcome]) -> None:
        """``outcomes`` go to ``client_id``, which maps them before it collects again."""
        if not self.prefix or not self._results:
            return
        segments = [s for o in outcomes if (s := frames.segment_of(o.payload))]
        if segments:
            with self._lock:
                self._handed.setdefault(client_id, []).extend(segments)

    def client_gone(self, client_id: str) -> None:
        """A client's connections ended: what it collected last is released, and so are
        its reusable segments that no job holds (the others as their jobs end)."""
        if not self.prefix:
            return
        self._release(self._handed_to(client_id))
        stem = shm.pool_stem(self.prefix, client_id)
        with self._lock:
            self._pool_clients.discard(client_id)
            held = {s for s in self._jobs.values() if s.startswith(stem)}
        for name in shm.names(stem):
            if name not in held:
                shm.unlink(name)

    def _handed_to(self, client_id: str) -> list[str]:
        with self._lock:
            return self._handed.pop(client_id, [])

    def _release(self, segments: list[str]) -> None:
        done = []
        with self._lock:
            for segment in segments:
                left = self._results.pop(segment, 1) - 1
                if left > 0:
                    self._results[segment] = left
                else:
                    done.append(segment)
        for segment in done:
            shm.unlink(segment)
