"""A Redis store's recurring schedules: ``{p}:s:spec`` and ``{p}:s:state`` (hashes by
schedule id: the pickled spec, and where the schedule stands) and ``{p}:s:order`` (ids in
the order they were first added, numbered by ``{p}:s:seq``). The caller (RedisStore) maps
redis-py's errors to the store's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpsched._store.base import StoredSchedule
from mpsched._store.redis.server import redis_module


def save(client: Any, base: str, schedule: StoredSchedule) -> None:
    """Record a schedule, replacing one with its id."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(base + "s:spec", schedule.schedule_id, schedule.spec)
    pipe.hset(base + "s:state", schedule.schedule_id, schedule.state)
    pipe.incr(base + "s:seq")
    (order,) = pipe.execute()[2:]
    client.zadd(base + "s:order", {schedule.schedule_id: order}, nx=True)


def save_unless_same(
    client: Any, base: str, schedule: StoredSchedule, same: Callable[[bytes], bool]
) -> StoredSchedule | None:
    """:func:`save`, unless the schedule recorded under its id has a spec ``same`` says is
    this one's: then that one is returned, unchanged. Optimistic (WATCH): a change of the
    schedules between the look and the write makes it look again."""
    watch_error = redis_module().WatchError
    spec_key, state_key = base + "s:spec", base + "s:state"
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(spec_key, state_key)
                spec = pipe.hget(spec_key, schedule.schedule_id)
                if spec is not None and same(spec):
                    state = pipe.hget(state_key, schedule.schedule_id) or b""
                    pipe.unwatch()
                    return StoredSchedule(schedule_id=schedule.schedule_id, spec=spec, state=state)
                pipe.multi()
                pipe.hset(spec_key, schedule.schedule_id, schedule.spec)
                pipe.hset(state_key, schedule.schedule_id, schedule.state)
                pipe.incr(base + "s:seq")
                order = pipe.execute()[2]
                break
            except watch_error:
                continue
    client.zadd(base + "s:order", {schedule.schedule_id: order}, nx=True)
    return None


def update(client: Any, base: str, schedule_id: str, state: bytes) -> None:
    """Record where a schedule stands (an unknown id is ignored)."""
    if client.hexists(base + "s:spec", schedule_id):
        client.hset(base + "s:state", schedule_id, state)


def delete(client: Any, base: str, schedule_id: str) -> None:
    pipe = client.pipeline(transaction=True)
    for name in ("s:spec", "s:state"):
        pipe.hdel(base + name, schedule_id)
    pipe.zrem(base + "s:order", schedule_id)
    pipe.execute()


def listing(client: Any, base: str) -> list[StoredSchedule]:
    """Every schedule, in the order they were first added."""
    pipe = client.pipeline(transaction=True)
    pipe.zrange(base + "s:order", 0, -1)
    pipe.hgetall(base + "s:spec")
    pipe.hgetall(base + "s:state")
    order, specs, states = pipe.execute()
    return [
        StoredSchedule(schedule_id=sid.decode(), spec=specs[sid], state=states.get(sid, b""))
        for sid in order
        if sid in specs
    ]
