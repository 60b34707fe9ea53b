"""SharedLeases: what the helpers of a SharedQueue share (mpsched._manager.shared_queue)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from mpsched._core.clock import Clock
from mpsched._core.leases import Leases
from mpsched._manager.store_outage import StoreOutage
from mpsched._store.redis.store import RedisStore


@dataclass(frozen=True)
class SharedLeases:
    """A manager's leases on a shared Redis queue, as the helpers of its queue share them.

    ``lock`` is the queue's: it guards ``leases``, ``tokens`` and every helper's fields,
    and is never held across a call to Redis.
    """

    store: RedisStore
    manager_id: str
    lease_timeout: float
    lock: threading.Lock
    clock: Clock
    leases: Leases
    outage: StoreOutage
    tokens: dict[str, str] = field(default_factory=dict)  # job id -> its lease's token
