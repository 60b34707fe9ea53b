"""Who may reach the manager's HTTP status server (``serve --http``), and how.

The rules, checked before the server starts:

- a loopback address (127.0.0.0/8, ``localhost``) may serve without a token: the page and
  the API are then read-only, and requests must name a loopback host (``Host:``), so that
  a web page elsewhere cannot read them through a DNS name rebound to 127.0.0.1;
- any other address needs a token file (``--http-token-file``, mode 0600, checked as an
  authkey file is) and TLS (the manager's own ``--tls-cert``/``--tls-key``): a bearer
  token sent in clear would be anyone's on the path;
- with a token, every request but the page's own code (``GET /``, which holds no data)
  must carry it in ``Authorization: Bearer TOKEN``, and it may also act (cancel a pending
  job, pause or resume a schedule).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mpsched._errors import AddressError, AuthenticationError, ConfigError
from mpsched._transport.address import is_loopback, parse_address
from mpsched._transport.authkey import read_secret
from mpsched._transport.tls import TlsConfig


@dataclass(frozen=True)
class HttpConfig:
    """Where the status server listens and what a request must carry.

    Attributes:
        token: the bearer token every request must carry; None: none (read-only).
        tls: the certificate and key of HTTPS (the manager's own); None: plain HTTP.
    """

    host: str
    port: int  # 0: any free port
    token: bytes | None = field(default=None, repr=False)
    tls: TlsConfig | None = None

    @property
    def loopback(self) -> bool:
        return is_loopback((self.host, self.port))

    def url(self, port: int | None = None) -> str:
        """The page's address (with ``port``, the one actually bound)."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port if port is None else port}/"


def http_config(address: str, token_file: str | os.PathLike[str] | None = None,
                tls: TlsConfig | None = None) -> HttpConfig:
    """The status server's setting for ``address`` (``HOST:PORT``), checked.

    Args:
        token_file: a file only this user can read that holds the token.
        tls: the manager's TLS setting; its certificate and key serve HTTPS.

    Raises:
        AddressError: ``address`` is not ``HOST:PORT``.
        AuthenticationError: the token file is another user's, readable by others, empty,
            unreadable, or holds what a header cannot carry.
        ConfigError: a non-loopback address without a token file, or without TLS.
    """
    parsed = parse_address(address)
    if not isinstance(parsed, tuple):
        raise AddressError(f"bad HTTP address {address!r}: the status server listens on "
                           f"TCP, HOST:PORT")
    token = None if token_file is None else read_token(token_file)
    config = HttpConfig(host=parsed[0], port=parsed[1], token=token,
                        tls=tls if tls is not None and tls.cert is not None else None)
    problem = unsafe(config)
    if problem:
        raise ConfigError("http", address, problem)
    return config


def unsafe(config: HttpConfig) -> str:
    """Why ``config`` must not serve ("" when it may): a non-loopback address needs both a
    token and TLS."""
    if config.loopback:
        return ""
    missing = [what for what, given in (("a token file (--http-token-file)", config.token),
                                        ("TLS (--tls-cert, --tls-key)", config.tls)) if not given]
    if not missing:
        return ""
    return (f"a loopback address, or {' and '.join(missing)}: anyone who can connect to "
            f"{config.host} could read the scheduler's jobs")


def read_token(path: str | os.PathLike[str]) -> bytes:
    """The token in the file ``path``, stripped of surrounding whitespace.

    Raises:
        AuthenticationError: as :func:`http_config` says.
    """
    token = read_secret(path, "HTTP token file")
    if not all(0x21 <= byte < 0x7F for byte in token):
        raise AuthenticationError(f"HTTP token file {path} holds characters an HTTP header "
                                  f"cannot carry: use printable ASCII without spaces")
    return token
