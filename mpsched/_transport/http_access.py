"""Who may reach the manager's HTTP status server (``serve --http``), and how.

Its address is ``HOST:PORT``, or a port alone, which listens on 127.0.0.1 (this machine
only). The rules, checked before the server starts:

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
import socket
from dataclasses import dataclass, field

from mpsched._errors import AddressError, AuthenticationError, ConfigError
from mpsched._transport.address import Address, is_loopback, parse_address
from mpsched._transport.authkey import read_secret
from mpsched._transport.tls import TlsConfig

LOOPBACK = "127.0.0.1"  # where a port given alone listens
WILDCARDS = ("0.0.0.0", "")  # hosts that mean every interface: the URL names this host
TOKEN_FILE = "a token file (--http-token-file)"
TLS = "TLS (--tls-cert, --tls-key)"


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
        """The page's address (with ``port``, the one actually bound); on every interface
        (0.0.0.0), by this host's name, which a browser elsewhere can open."""
        scheme = "https" if self.tls is not None else "http"
        host = socket.gethostname() if self.host in WILDCARDS else self.host
        return f"{scheme}://{host}:{self.port if port is None else port}/"


def parse_http_address(address: str | int) -> tuple[str, int]:
    """``(host, port)`` of ``address``: ``HOST:PORT``, or a port alone (a str of digits or
    an int), which means 127.0.0.1, this machine only.

    Raises:
        AddressError: anything else (a Unix socket, an IPv6 address, a port out of range).
    """
    if isinstance(address, int) and not isinstance(address, bool):
        address = str(address)
    if not isinstance(address, str):
        raise AddressError(f"bad HTTP address {address!r}: give a port or 'HOST:PORT'")
    text = f"{LOOPBACK}:{address}" if address.isascii() and address.isdigit() else address
    try:
        parsed: Address | None = parse_address(text)
    except AddressError:
        parsed = None
    if isinstance(parsed, tuple):
        return parsed
    raise AddressError(
        f"bad HTTP address {address!r}: use a port (0 to 65535; on "
        f"{LOOPBACK}, this machine only) or HOST:PORT, with an IPv4 address "
        f"or a host name"
    )


def http_config(
    address: str | int,
    token_file: str | os.PathLike[str] | None = None,
    tls: TlsConfig | None = None,
) -> HttpConfig:
    """The status server's setting for ``address`` (``HOST:PORT`` or a port: see
    :func:`parse_http_address`), checked.

    Args:
        token_file: a file only this user can read that holds the token.
        tls: the manager's TLS setting; its certificate and key serve HTTPS.

    Raises:
        AddressError: ``address`` is neither ``HOST:PORT`` nor a port.
        AuthenticationError: the token file is another user's, readable by others, empty,
            unreadable, or holds what a header cannot carry.
        ConfigError: a non-loopback address without a token file, or without TLS.
    """
    host, port = parse_http_address(address)
    token = None if token_file is None else read_token(token_file)
    config = HttpConfig(
        host=host,
        port=port,
        token=token,
        tls=tls if tls is not None and tls.cert is not None else None,
    )
    lacking = "" if config.loopback else missing(token=token, tls=config.tls)
    if lacking:
        raise ConfigError(
            "http",
            address,
            f"a loopback address (a port alone: {LOOPBACK}:PORT), or given {lacking}",
        )
    return config


def missing(*, token: object, tls: object) -> str:
    """What a status server on a non-loopback address lacks, in words ("" for nothing):
    it needs both a token and TLS."""
    return " and ".join(what for what, given in ((TOKEN_FILE, token), (TLS, tls)) if not given)


def read_token(path: str | os.PathLike[str]) -> bytes:
    """The token in the file ``path``, stripped of surrounding whitespace.

    Raises:
        AuthenticationError: as :func:`http_config` says.
    """
    token = read_secret(path, "HTTP token file")
    if not all(0x21 <= byte < 0x7F for byte in token):
        raise AuthenticationError(
            f"HTTP token file {path} holds characters an HTTP header "
            f"cannot carry: use printable ASCII without spaces"
        )
    return token
