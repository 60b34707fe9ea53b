"""Connecting to the Redis server of a store, and checking that it can hold jobs.

:func:`connect` opens a client (redis-py with hiredis) and makes sure, within the
timeout, that a Redis server of a version we can use answers there with the password
given, and that its settings keep jobs: a ``maxmemory-policy`` other than ``noeviction``
could evict them and is refused; a server without persistence (no AOF, no RDB) is
accepted with one WARNING. Whatever fails is one :class:`StoreError` naming the URL (its
password as ``***``) and what was found there instead.

Settings and what they give (the README's table): ``appendonly yes`` with ``appendfsync
always``: an acknowledged submit survives a crash of Redis or its machine; ``everysec``:
up to the last second of changes can be lost; RDB snapshots only: everything since the
last snapshot; neither: a restart of Redis loses every job.
"""

from __future__ import annotations

import importlib
import logging
import ssl
from types import ModuleType
from typing import Any, NamedTuple

from mpsched._errors import ConfigError, ExtraMissingError, StoreError
from mpsched._store.redis.url import RedisURL, is_redis_url, parse_redis_url

log = logging.getLogger("mpsched.store")

MIN_VERSION = (6, 2)  # LPOP with a count, GETDEL, SET ... GET
CONNECT_TIMEOUT = 3.0  # seconds to connect, and for each answer while checking
OPERATION_TIMEOUT = 10.0  # seconds any later command may take before it fails


class ServerSettings(NamedTuple):
    """What :func:`check_settings` read from the server."""

    version: tuple[int, ...]
    eviction: str  # maxmemory-policy
    appendonly: bool
    appendfsync: str
    rdb: bool  # snapshots are configured (``save`` is not empty)
    max_bulk: int  # proto-max-bulk-len: the largest string the server takes


def redis_module() -> ModuleType:
    """redis-py, or ExtraMissingError naming the extra that brings it."""
    try:
        return importlib.import_module("redis")
    except ImportError:
        raise ExtraMissingError("Redis stores (store='redis://...')", "redis", "redis") from None


def connect(
    url: RedisURL, *, timeout: float = CONNECT_TIMEOUT, operation_timeout: float = OPERATION_TIMEOUT
) -> Any:
    """A redis-py client of the server ``url`` names, checked (see :func:`check_settings`).

    Raises:
        ExtraMissingError: redis-py is not installed.
        StoreError: nothing answers there within ``timeout``, what answers is not Redis,
            the password is refused, the server is too old, or it may evict keys.
    """
    client = open_client(url, timeout=timeout)
    try:
        settings = check_settings(client, url)
    except BaseException:
        client.close()
        raise
    warn_persistence(url, settings)
    client.close()
    return open_client(url, timeout=operation_timeout)


def open_client(url: RedisURL, *, timeout: float) -> Any:
    """An unchecked client of ``url``, every command bounded by ``timeout`` seconds and
    never retried by redis-py (a store retries, with back-off, where it may)."""
    redis = redis_module()
    retry = importlib.import_module("redis.retry").Retry(
        importlib.import_module("redis.backoff").NoBackoff(), 0
    )
    return redis.Redis(
        socket_connect_timeout=timeout, socket_timeout=timeout, retry=retry, **url.client_options()
    )


def check_settings(client: Any, url: RedisURL) -> ServerSettings:
    """Read the server's version and settings; refuse those that cannot keep jobs.

    Raises:
        StoreError: as :func:`connect`.
    """
    try:
        info = client.info("server")
        settings = _settings(client, info)
    except Exception as exc:
        raise StoreError(url.redacted, describe(exc, password=url.password is not None)) from None
    if settings.version < MIN_VERSION:
        have = ".".join(map(str, settings.version))
        need = ".".join(map(str, MIN_VERSION))
        raise StoreError(
            url.redacted, f"the server runs Redis {have}; mpsched needs Redis {need} or later"
        )
    if settings.eviction != "noeviction":
        raise StoreError(
            url.redacted,
            f"the server's maxmemory-policy is "
            f"{settings.eviction}: it may evict jobs when its "
            f"memory is full; set maxmemory-policy noeviction",
        )
    return settings


def warn_persistence(url: RedisURL, settings: ServerSettings) -> None:
    """One WARNING if the server keeps nothing on disk."""
    if not settings.appendonly and not settings.rdb:
        log.warning(
            "the Redis server of %s keeps nothing on disk (appendonly no, no RDB "
            "snapshots): a restart of Redis loses every job; set appendonly yes "
            "(appendfsync always: every acknowledged submit survives)",
            url.redacted,
        )


def _settings(client: Any, info: dict[str, Any]) -> ServerSettings:
    version = tuple(
        int(part) for part in str(info["redis_version"]).split(".")[:3] if part.isdigit()
    )
    memory = client.info("memory")
    persistence = client.info("persistence")
    config = _config(client, "save", "appendfsync", "proto-max-bulk-len")
    return ServerSettings(
        version=version,
        eviction=str(memory.get("maxmemory_policy", "noeviction")),
        appendonly=bool(int(persistence.get("aof_enabled", 0))),
        appendfsync=config.get("appendfsync", "unknown"),
        # Where CONFIG is not allowed (some hosted Redis), assume snapshots are on.
        rdb=config.get("save", "unknown").strip() != "",
        max_bulk=int(config.get("proto-max-bulk-len", 512 * 2**20)),
    )


def _config(client: Any, *names: str) -> dict[str, str]:
    """CONFIG GET of ``names`` as text; {} where the server does not allow CONFIG."""
    redis = redis_module()
    try:
        raw = client.config_get(*names)
    except redis.ResponseError:
        return {}
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(exc: BaseException, *, password: bool = True) -> str:
    """What a failed command or connection found, as the rest of a StoreError's message
    (redis-py's own messages name the host, never the password). ``password``: the URL
    gave one."""
    redis = redis_module()
    text = str(exc)
    needs = ("NOAUTH", "Authentication required", "already authenticated")
    if not password and (
        isinstance(exc, redis.AuthenticationError) or any(word in text for word in needs)
    ):
        return "the server needs a password: give it in the URL (redis://:PASSWORD@HOST)"
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text:
        return "the server refused the password (or user) in the URL"
    if isinstance(exc, redis.TimeoutError):
        return f"no answer in time ({text}): is it a Redis server, up and not paused?"
    if isinstance(exc, ssl.SSLError) or "SSL" in text:
        return f"TLS failed ({text})"
    if isinstance(exc, redis.ConnectionError):
        if "Error 111" in text or "refused" in text.lower():
            return f"nothing is listening there ({text})"
        if "Error 2 " in text:
            return f"no such socket file ({text})"
        return f"cannot connect ({text})"
    if isinstance(exc, redis.InvalidResponse):
        return f"what listens there is not a Redis server ({text})"
    if isinstance(exc, redis.DataError):  # raised here, before anything was sent
        return f"the Redis client refused a command's argument ({text})"
    if isinstance(exc, redis.ResponseError):
        return f"the server refused a command ({text})"
    return f"{type(exc).__name__}: {text}"


def check_store(store: str, *, lease_timeout: float) -> None:
    """Check at the call site what a Redis store takes, before any process starts. (Its
    ``order`` is checked when the manager joins the store's live managers: its first
    heartbeat, RedisStore.heartbeat.)

    Raises:
        ConfigError: a bad Redis URL, or ``lease_timeout`` not a positive number of
            seconds.
        ExtraMissingError: the URL is a Redis one and redis-py is not installed.
    """
    if (
        isinstance(lease_timeout, bool)
        or not isinstance(lease_timeout, (int, float))
        or not 0 < lease_timeout < float("inf")
    ):
        raise ConfigError("lease_timeout", lease_timeout, "a positive number of seconds")
    if not is_redis_url(store):
        return
    parse_redis_url(store)
    redis_module()
