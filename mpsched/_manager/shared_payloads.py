"""ClaimedPayloads: where the payloads of the jobs a manager claims from Redis come from.

A job submitted here with large buffers keeps them in this manager's shared memory: Redis
holds its payload inline, and a claim by this manager leaves it out, since the framed
payload that names the segment is here (mpsched._payload.segments).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mpsched._core.job import Payload
from mpsched._payload import frames
from mpsched._store.redis.records import Reply
from mpsched._store.redis.store import RedisStore

log = logging.getLogger("mpsched.manager")


class ClaimedPayloads:
    """The payloads of one manager's claimed jobs, as its workers take them."""

    def __init__(self, store: RedisStore, manager_id: str) -> None:
        self._store = store
        self._me = manager_id
        # The framed payload of a job whose large buffers this manager keeps in shared
        # memory (None: not one of those); its claims get no payload for it from Redis.
        self.held_payload: Callable[[str], Payload | None] = lambda job_id: None

    def of(self, reply: Reply) -> Reply:
        """``reply`` with each claimed payload as this manager's workers take it:

        - a job held here in shared memory (Redis left its payload out): the framed
          payload that names the segment. One this manager no longer holds (it ended
          here under a lease that had run out, and a peer put it back) is read from Redis;
        - a job another manager's client submitted: without the empty frame that tells a
          worker that the job's client maps this manager's shared memory (it does not:
          a large result then goes inline, rather than into a segment read back at once).

        Any other payload comes back as it is, and so does a reply with only those.

        Raises:
            StoreUnavailableError, StoreError: a payload could not be read from Redis.
        """
        me = self._me
        if all(c.payload and (c.owner == me or c.payload[:4] != frames.MAGIC) for c in reply.jobs):
            return reply
        jobs = []
        for claimed in reply.jobs:
            payload = claimed.payload or self.held_payload(claimed.job_id)
            if payload is None:
                log.info(
                    "job %s was claimed without its payload, which this manager "
                    "no longer holds; it is read from the store",
                    claimed.job_id,
                )
                payload = self._store.payload(claimed.job_id)
            elif claimed.owner != me:
                payload = frames.unframed(payload)
            jobs.append(claimed._replace(payload=payload))
        return reply._replace(jobs=jobs)
