"""A subscription to some channels of a store's server, read by one thread (a manager's
subscriber: mpsched._manager.shared_link)."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mpsched._store.redis.server import CONNECT_TIMEOUT


class Subscription:
    """Messages on ``channels``, on a redis-py PubSub of its own; ``errors`` is the store's
    mapping of redis-py's exceptions (RedisStore.errors)."""

    def __init__(
        self,
        pubsub: Any,
        channels: Sequence[str],
        errors: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._pubsub = pubsub
        self._errors = errors
        # Messages that came while the subscriptions were being confirmed: a message on
        # a channel confirmed first may come before the next confirmation. The reading
        # thread's own (nobody else touches it).
        self._early: collections.deque[tuple[str, bytes]] = collections.deque()
        with errors():
            pubsub.subscribe(*channels)
            confirmed, deadline = 0, time.monotonic() + CONNECT_TIMEOUT
            while confirmed < len(channels) and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=deadline - time.monotonic())
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    confirmed += 1
                elif message["type"] == "message":
                    self._early.append((message["channel"].decode(), message["data"]))

    def message(self, timeout: float) -> tuple[str, bytes] | None:
        """The next message (its channel and data), waiting up to ``timeout`` seconds on
        the socket; None when none came.

        Raises:
            StoreUnavailableError: the connection was lost.
        """
        if self._early:
            return self._early.popleft()
        with self._errors():
            message = self._pubsub.get_message(timeout=timeout)
        if message is None or message["type"] != "message":
            return None
        return message["channel"].decode(), message["data"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pubsub.close()
