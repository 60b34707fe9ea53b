"""A subscription to some channels of a store's server, read by one thread (a manager's
subscriber: mpsched._manager.shared_link)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mpsched._store.redis.server import CONNECT_TIMEOUT


class Subscription:
    """Messages on ``channels``, on a redis-py PubSub of its own; ``errors`` is the store's
    mapping of redis-py's exceptions (RedisStore.errors)."""

    def __init__(self, pubsub: Any, channels: Sequence[str],
                 errors: Callable[[], AbstractContextManager[None]]) -> None:
        self._pubsub = pubsub
        self._errors = errors
        with errors():
            pubsub.subscribe(*channels)
            for _ in channels:  # the server confirms each one
                pubsub.get_message(timeout=CONNECT_TIMEOUT)

    def message(self, timeout: float) -> tuple[str, bytes] | None:
        """The next message (its channel and data), waiting up to ``timeout`` seconds on
        the socket; None when none came.

        Raises:
            StoreUnavailableError: the connection was lost.
        """
        with self._errors():
            message = self._pubsub.get_message(timeout=timeout)
        if message is None or message["type"] != "message":
            return None
        return message["channel"].decode(), message["data"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pubsub.close()
