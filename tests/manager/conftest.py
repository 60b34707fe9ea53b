"""Fixtures of the manager tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from shared_peers import Peer


@pytest.fixture
def peers(redis_url: str) -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def make(name: str, **options: Any) -> Peer:
        made.append(Peer(options.pop("url", redis_url), name, **options))
        return made[-1]

    yield make
    for peer in made:
        peer.close()
