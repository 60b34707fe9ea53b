"""A Redis store's session on its server: the checked settings, the client, its channels,
closing, and the store's errors for what redis-py raises (a server that does not answer
is an outage)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mpsched._errors import (
    InvalidJobError,
    StoreError,
    StoreInDoubtError,
    StoreUnavailableError,
)
from mpsched._store.redis.script_runner import Unanswered
from mpsched._store.redis.server import (
    ServerSettings,
    check_settings,
    describe,
    open_client,
    redis_module,
    warn_persistence,
)
from mpsched._store.redis.subscription import Subscription
from mpsched._store.redis.url import RedisURL


class Session:
    """One store's client on its checked server, its channels, its closed state, its errors.

    Args:
        url: the server's parsed URL.
        timeout: seconds to connect and check the server.
        operation_timeout: seconds every later command may take.
        on_unavailable: told of every call that found the server not answering.
    Raises:
        StoreError: no usable Redis server answers there (see ``server.connect``).
    """

    def __init__(
        self,
        url: RedisURL,
        *,
        timeout: float,
        operation_timeout: float,
        on_unavailable: Callable[[StoreUnavailableError], None],
    ) -> None:
        self.url = url
        self.redis: Any = redis_module()
        checking = open_client(url, timeout=timeout)
        try:
            self.settings: ServerSettings = check_settings(checking, url)
        finally:
            checking.close()
        warn_persistence(url, self.settings)
        self.client = open_client(url, timeout=operation_timeout)
        # Guards _closed; nobody waits on it.
        self._lock = threading.Lock()
        self._closed = False
        self._on_unavailable = on_unavailable

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Turn what redis-py raises into the store's errors: StoreUnavailableError when
        the server does not answer (StoreInDoubtError when it took a script and gave no
        answer: it may have run it), InvalidJobError for a job the store refused, else
        StoreError; all naming the URL without its password."""
        if self._closed:
            raise StoreError(self.url.redacted, "the store is closed")
        try:
            yield
        except Unanswered as exc:
            doubt = StoreInDoubtError(self.url.redacted, describe(exc.cause))
            self._on_unavailable(doubt)
            raise doubt from None
        except (self.redis.ConnectionError, self.redis.TimeoutError, OSError) as exc:
            if isinstance(exc, StoreError):
                raise
            if not isinstance(exc, self.redis.TimeoutError):
                # The server went away: its idle pooled connections are stale too.
                self.client.connection_pool.disconnect(inuse_connections=False)
            error = StoreUnavailableError(self.url.redacted, describe(exc))
            self._on_unavailable(error)
            raise error from None
        except self.redis.ResponseError as exc:
            text = str(exc)
            if "DUPLICATE" in text:
                raise InvalidJobError(text.split("DUPLICATE ", 1)[-1]) from None
            raise StoreError(self.url.redacted, describe(exc)) from None
        except self.redis.RedisError as exc:
            raise StoreError(self.url.redacted, describe(exc)) from None

    def subscriber(self) -> Any:
        """A redis-py PubSub on this store's server (the caller subscribes and reads it)."""
        with self.errors():
            return self.client.pubsub(ignore_subscribe_messages=False)

    def subscribe(self, channels: Sequence[str]) -> Subscription:
        """Listen on ``channels`` (on a connection of its own), once the server confirmed
        each subscription.

        Raises:
            StoreUnavailableError, StoreError: as :meth:`errors`.
        """
        with self.errors():
            pubsub = self.client.pubsub()
            try:
                return Subscription(pubsub, channels, self.errors)
            except BaseException:
                pubsub.close()
                raise

    def check_open(self) -> None:
        """Raise StoreError once the store is closed."""
        if self._closed:
            raise StoreError(self.url.redacted, "the store is closed")

    def close(self) -> bool:
        """Mark the session closed; False when it was already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        return True
