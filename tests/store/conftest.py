"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpsched._store.redis.store import RedisStore


@pytest.fixture
def open_redis_store(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    """RedisStores on one prefix of the shared server (each a manager's connection; another
    URL may be given), closed when the test ends."""
    opened: list[RedisStore] = []

    def open_(url: str = redis_url, **options: Any) -> RedisStore:
        opened.append(RedisStore(url, **options))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()
