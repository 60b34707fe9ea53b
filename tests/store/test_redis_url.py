"""Store URLs and the server checks: what a Redis URL may say, and the one clear
StoreError (URL named, password never shown) for every server that cannot hold jobs."""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpsched._errors import ConfigError, ExtraMissingError, StoreError
from mpsched._store.redis import server as redis_server_module
from mpsched._store.redis.store import RedisStore
from mpsched._store.redis.url import is_redis_url, parse_redis_url

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("url", "redacted", "options"),
    [
        (
            "redis://localhost",
            "redis://localhost:6379/0",
            {"host": "localhost", "port": 6379, "db": 0},
        ),
        (
            f"redis://:{SECRET}@db1:7000/3?prefix=jobs.eu",
            "redis://:***@db1:7000/3?prefix=jobs.eu",
            {"host": "db1", "port": 7000, "db": 3, "password": SECRET},
        ),
        (
            "unix:///run/redis.sock?db=2",
            "unix:///run/redis.sock?db=2",
            {"unix_socket_path": "/run/redis.sock", "db": 2},
        ),
        (
            f"unix:///run/r.sock?password={SECRET}",
            "unix://:***@/run/r.sock?db=0",
            {"unix_socket_path": "/run/r.sock", "password": SECRET},
        ),
        (
            f"rediss://app:{SECRET}@db1?ca=/etc/ca.pem&db=4",
            "rediss://app:***@db1:6379/4",
            {"ssl": True, "ssl_ca_certs": "/etc/ca.pem", "username": "app", "db": 4},
        ),
    ],
    ids=["host", "password-db-prefix", "unix", "unix-password", "tls"],
)
def test_a_redis_url_gives_its_parts_and_hides_its_password(
    url: str, redacted: str, options: dict[str, Any]
) -> None:
    parsed = parse_redis_url(url)
    assert parsed.redacted == redacted
    assert SECRET not in repr(parsed)
    assert options.items() <= parsed.client_options().items()
    assert is_redis_url(url)


def test_the_prefix_defaults_to_mpsched_and_names_the_hash_tag() -> None:
    assert parse_redis_url("redis://h").prefix == "mpsched"
    assert parse_redis_url("redis://h?prefix=a-b_c.d").prefix == "a-b_c.d"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@h/1?db=2",
        f"redis://:{SECRET}@h?sslmode=x",
        "redis://h?prefix=a{b}",
        "redis://h?prefix=",
        "redis://h:99999",
        "unix://",
        f"redis://:{SECRET}@h/x",
        "redis://",
    ],
    ids=[
        "two-dbs",
        "unknown-option",
        "braces",
        "empty-prefix",
        "port",
        "no-path",
        "db-word",
        "no-host",
    ],
)
def test_a_bad_redis_url_is_a_config_error_without_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_redis_url(url)
    assert SECRET not in str(caught.value)
    assert caught.value.option == "store"


def test_paths_are_not_redis_urls() -> None:
    assert not is_redis_url("jobs.db")
    assert not is_redis_url("/var/lib/redis://x")
    assert is_redis_url("REDIS://h")


def test_without_redis_py_a_redis_url_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_redis(name: str, *args: Any) -> Any:
        if name == "redis" or name.startswith("redis."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_redis)
    with pytest.raises(ExtraMissingError, match=r"mpsched\[redis\]"):
        RedisStore("redis://127.0.0.1:1")


# ---------------------------------------------------------------- servers that cannot serve


@pytest.fixture
def listener() -> Iterator[Callable[[bytes | None], int]]:
    """Loopback ports where something that is not Redis listens: it answers ``reply`` to
    whatever it reads, or stays silent (None)."""
    sockets: list[socket.socket] = []
    stop = threading.Event()

    def listen(reply: bytes | None) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        sockets.append(server)

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    if reply is not None:
                        conn.recv(1024)
                        conn.sendall(reply)
                    stop.wait(10)

        threading.Thread(target=serve, daemon=True).start()
        return int(server.getsockname()[1])

    yield listen
    stop.set()
    for server in sockets:
        server.close()


def _refused(url: str, timeout: float = 3.0) -> StoreError:
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        RedisStore(url, timeout=timeout)
    assert time.monotonic() - started < timeout + 2.0
    assert SECRET not in str(caught.value)
    return caught.value


def test_nothing_listening_is_one_store_error_naming_the_url() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = _refused(f"redis://:{SECRET}@127.0.0.1:{port}/0")
    assert f"redis://:***@127.0.0.1:{port}/0" in str(error)
    assert "nothing is listening" in str(error)


def test_a_missing_socket_file_is_a_store_error(tmp_path: Any) -> None:
    error = _refused(f"unix://{tmp_path}/none.sock")
    assert "no such socket file" in str(error)


def test_a_port_where_something_else_answers_is_not_redis(
    listener: Callable[[bytes | None], int],
) -> None:
    port = listener(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert "not a Redis server" in str(_refused(f"redis://:{SECRET}@127.0.0.1:{port}"))


def test_an_argument_the_redis_client_refuses_is_not_blamed_on_the_server() -> None:
    import redis

    from mpsched._store.redis.server import describe

    said = describe(redis.DataError("Invalid input of type: 'dict'"))
    assert said.startswith("the Redis client refused a command's argument"), said


def test_a_silent_port_fails_within_the_timeout(listener: Callable[[bytes | None], int]) -> None:
    port = listener(None)
    assert "no answer in time" in str(_refused(f"redis://127.0.0.1:{port}", timeout=0.5))


def test_a_wrong_or_missing_password_is_refused(own_redis: Callable[..., Any]) -> None:
    server = own_redis(requirepass="right-password")
    wrong = f"unix://:{SECRET}@{server.socket}"
    assert "refused the password" in str(_refused(wrong))
    assert "needs a password" in str(_refused(f"unix://{server.socket}"))
    RedisStore(server.url()).close()  # the right one is taken


def test_an_old_redis_is_refused_naming_both_versions(
    shared_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_server_module, "MIN_VERSION", (99, 0))
    error = _refused(shared_redis.url())
    assert "needs Redis 99.0 or later" in str(error) and "the server runs Redis 7" in str(error)


def test_a_server_that_may_evict_keys_is_refused_naming_the_setting(
    own_redis: Callable[..., Any],
) -> None:
    server = own_redis(maxmemory_policy="allkeys-lru")
    error = _refused(server.url())
    assert "maxmemory-policy is allkeys-lru" in str(error)
    assert "noeviction" in str(error)


def test_no_persistence_starts_with_one_warning(
    own_redis: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    bare = own_redis()
    durable = own_redis(appendonly="yes", appendfsync="always")
    with caplog.at_level(logging.WARNING, logger="mpsched.store"):
        RedisStore(bare.url()).close()
        warned = [r for r in caplog.records if "keeps nothing on disk" in r.message]
        assert len(warned) == 1 and "loses every job" in warned[0].message
        caplog.clear()
        store = RedisStore(durable.url())
        assert (store.settings.appendonly, store.settings.appendfsync) == (True, "always")
        store.close()
    assert not [r for r in caplog.records if "keeps nothing on disk" in r.message]
