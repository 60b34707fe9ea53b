"""A Redis store's recurring schedules: ``{p}:s:spec`` and ``{p}:s:state`` (hashes by
schedule id: the pickled spec, and where the schedule stands) and ``{p}:s:order`` (ids in
the order they were first added, numbered by ``{p}:s:seq``); a change is published on
``{p}:sched``."""

from __future__ import annotations

from collections.abc import Callable

from mpsched._store.base import StoredSchedule
from mpsched._store.redis.session import Session


class Schedules:
    """The schedules one store keeps on its server, shared by every manager of it."""

    def __init__(self, session: Session, base: str) -> None:
        self._session = session
        self._client = session.client
        self._base = base

    def save(self, schedule: StoredSchedule) -> None:
        """Record a schedule, replacing one with its id."""
        base = self._base
        with self._session.errors():
            pipe = self._client.pipeline(transaction=True)
            pipe.hset(base + "s:spec", schedule.schedule_id, schedule.spec)
            pipe.hset(base + "s:state", schedule.schedule_id, schedule.state)
            pipe.incr(base + "s:seq")
            (order,) = pipe.execute()[2:]
            self._client.zadd(base + "s:order", {schedule.schedule_id: order}, nx=True)

    def save_unless_same(
        self, schedule: StoredSchedule, same: Callable[[bytes], bool]
    ) -> StoredSchedule | None:
        """Record a schedule, unless one with its id is recorded already whose spec
        ``same`` says is this one's: then that one, as recorded (its timeline), is
        returned and nothing is written. One step across managers: of two that add the
        same schedule at once, one writes and the other gets what it wrote. Optimistic
        (WATCH): a change of the schedules between the look and the write makes it look
        again."""
        base = self._base
        spec_key, state_key = base + "s:spec", base + "s:state"
        with self._session.errors():
            with self._client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(spec_key, state_key)
                        spec = pipe.hget(spec_key, schedule.schedule_id)
                        if spec is not None and same(spec):
                            state = pipe.hget(state_key, schedule.schedule_id) or b""
                            pipe.unwatch()
                            return StoredSchedule(
                                schedule_id=schedule.schedule_id, spec=spec, state=state
                            )
                        pipe.multi()
                        pipe.hset(spec_key, schedule.schedule_id, schedule.spec)
                        pipe.hset(state_key, schedule.schedule_id, schedule.state)
                        pipe.incr(base + "s:seq")
                        order = pipe.execute()[2]
                        break
                    except self._session.redis.WatchError:
                        continue
            self._client.zadd(base + "s:order", {schedule.schedule_id: order}, nx=True)
        return None

    def update(self, schedule_id: str, state: bytes) -> None:
        """Record where a schedule stands (an unknown id is ignored)."""
        with self._session.errors():
            if self._client.hexists(self._base + "s:spec", schedule_id):
                self._client.hset(self._base + "s:state", schedule_id, state)

    def delete(self, schedule_id: str) -> None:
        """Forget a schedule (an unknown id is ignored)."""
        with self._session.errors():
            pipe = self._client.pipeline(transaction=True)
            for name in ("s:spec", "s:state"):
                pipe.hdel(self._base + name, schedule_id)
            pipe.zrem(self._base + "s:order", schedule_id)
            pipe.execute()

    def listing(self) -> list[StoredSchedule]:
        """Every schedule, in the order they were first added."""
        with self._session.errors():
            pipe = self._client.pipeline(transaction=True)
            pipe.zrange(self._base + "s:order", 0, -1)
            pipe.hgetall(self._base + "s:spec")
            pipe.hgetall(self._base + "s:state")
            order, specs, states = pipe.execute()
        return [
            StoredSchedule(schedule_id=sid.decode(), spec=specs[sid], state=states.get(sid, b""))
            for sid in order
            if sid in specs
        ]

    def publish(self, schedule_id: str) -> None:
        """Tell every manager (``{p}:sched``) that a schedule changed in the store."""
        with self._session.errors():
            self._client.publish(self._base + "sched", schedule_id)
