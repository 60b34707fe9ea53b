"""Manager addresses: ``unix:PATH`` (a Unix socket) or ``HOST:PORT`` (TCP, IPv4), as the
command line spells them, and which of them only this machine can reach."""

from __future__ import annotations

import ipaddress
from typing import Any

from mpsched._errors import AddressError

Address = str | tuple[str, int]


def parse_address(text: str) -> Address:
    """``unix:/path`` (or a path with a slash) -> str; ``host:port`` -> (host, port).

    Raises:
        AddressError: anything else.
    """
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise AddressError("unix: needs a path, as in unix:/run/mpsched.sock")
        return path
    if "/" in text:
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"bad address {text!r}: use HOST:PORT or unix:PATH")
    host = host.strip("[]")
    if ":" in host:
        # multiprocessing.connection opens every TCP socket as AF_INET.
        raise AddressError(
            f"bad address {text!r}: IPv6 is not supported; use an IPv4 "
            f"address, a host name or unix:PATH"
        )
    return (host, int(port))


def format_address(address: Any) -> str:
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return f"unix:{address}"


def is_loopback(address: Address) -> bool:
    """True for Unix sockets and TCP addresses that only this machine can reach."""
    if isinstance(address, str):
        return True
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
