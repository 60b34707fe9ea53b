"""Store URLs: which store a ``store=`` string names, and a Redis URL's parts.

``store="jobs.db"`` is a SQLite file; ``redis://``, ``rediss://`` (TLS) and ``unix://``
URLs name a Redis server. Parsing never imports redis-py, so a bad URL is refused the
same way with or without the extra, and nothing here connects. A URL's password never
appears in a message: :attr:`RedisURL.redacted` stands in for the URL everywhere it is
shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from mpsched._errors import ConfigError

SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PREFIX = "mpsched"
DEFAULT_PORT = 6379
# A prefix goes between the braces of a Redis Cluster hash tag: no braces, no spaces.
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
QUERY_OPTIONS = frozenset({"db", "prefix", "password", "ca", "cert", "key"})
EXPECTED = (
    "a SQLite file, or a Redis URL: redis://[:PASSWORD@]HOST[:PORT][/DB], "
    "rediss://... (TLS) or unix:///PATH, with ?db=N and ?prefix=NAME"
)


def is_redis_url(store: str) -> bool:
    """Whether ``store`` names a Redis server rather than a SQLite file."""
    return store.split("://", 1)[0].lower() in SCHEMES and "://" in store


@dataclass(frozen=True)
class RedisURL:
    """A parsed Redis store URL. ``redacted`` is the URL with its password replaced."""

    scheme: str
    host: str | None  # None for a Unix socket
    port: int | None
    path: str | None  # the Unix socket's path
    db: int
    prefix: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca: str | None = None  # rediss: a CA file to verify the server with
    cert: str | None = None  # rediss: a client certificate and its key
    key: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    @property
    def redacted(self) -> str:
        """The URL as messages show it, its password as ``***``."""
        auth = (self.username or "") + (":***" if self.password else "")
        auth += "@" if auth else ""
        query = [] if self.prefix == DEFAULT_PREFIX else [f"prefix={self.prefix}"]
        if self.path is not None:
            query.insert(0, f"db={self.db}")
            where = f"{auth}{self.path}"
        else:
            where = f"{auth}{self.host}:{self.port}/{self.db}"
        return f"{self.scheme}://{where}" + ("?" + "&".join(query) if query else "")

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis`` (timeouts are the caller's)."""
        options: dict[str, Any] = {
            "db": self.db,
            "username": self.username,
            "password": self.password,
        }
        if self.path is not None:
            options["unix_socket_path"] = self.path
        else:
            options.update(host=self.host, port=self.port)
        if self.tls:
            options.update(
                ssl=True, ssl_ca_certs=self.ca, ssl_certfile=self.cert, ssl_keyfile=self.key
            )
        return options


def parse_redis_url(url: str) -> RedisURL:
    """Parse a ``redis://``, ``rediss://`` or ``unix://`` store URL.

    Raises:
        ConfigError: not such a URL, or a part of it that cannot be used (a port or db
            that is not a number, an unknown query option, a prefix with braces); the
            message shows the URL without its password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError("store", _scrub(url), f"{EXPECTED} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError("store", _scrub(url), EXPECTED)
    query = _query(url, parts.query)
    password = _one(query, "password") or (unquote(parts.password) if parts.password else None)
    username = unquote(parts.username) if parts.username else None
    given = _one(query, "prefix")
    prefix = DEFAULT_PREFIX if given is None else given
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise ConfigError(
            "store", _scrub(url), "a URL whose ?prefix= is 1 to 64 letters, digits or _ . : -"
        )
    db_text = _one(query, "db")
    if scheme == "unix":
        if not parts.path or (parts.netloc not in ("", "localhost") and "@" not in parts.netloc):
            raise ConfigError("store", _scrub(url), "a unix:///PATH URL with an absolute path")
        return RedisURL(
            scheme=scheme,
            host=None,
            port=None,
            path=parts.path,
            db=_db(url, db_text),
            prefix=prefix,
            username=username,
            password=password,
        )
    if not parts.hostname:
        raise ConfigError("store", _scrub(url), f"{EXPECTED} (no host)")
    path_db = parts.path.strip("/")
    if path_db and db_text is not None and path_db != db_text:
        raise ConfigError("store", _scrub(url), "a URL with one database number, not two")
    return RedisURL(
        scheme=scheme,
        host=parts.hostname,
        port=port or DEFAULT_PORT,
        path=None,
        db=_db(url, db_text if db_text is not None else path_db or None),
        prefix=prefix,
        username=username,
        password=password,
        ca=_one(query, "ca"),
        cert=_one(query, "cert"),
        key=_one(query, "key"),
    )


def _query(url: str, query: str) -> dict[str, list[str]]:
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - QUERY_OPTIONS)
    if unknown:
        raise ConfigError(
            "store",
            _scrub(url),
            f"a URL whose options are among "
            f"{', '.join(sorted(QUERY_OPTIONS))} (unknown: {', '.join(unknown)})",
        )
    return options


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return None if not values else values[-1]


def _db(url: str, text: str | None) -> int:
    if text is None or text == "":
        return 0
    if not text.isdigit():
        raise ConfigError("store", _scrub(url), "a URL whose database is a number >= 0")
    return int(text)


def _scrub(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for a message about a bad URL)."""
    url = re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)
    return re.sub(r"^([^:/]+://[^:@/]*:)[^@/]*@", r"\1***@", url)


def shown_store(store: str) -> str:
    """A ``store=`` string as messages show it: a Redis URL without its password."""
    return parse_redis_url(store).redacted if is_redis_url(store) else store
