"""Opening a client's connection to a manager at an address, and saying why it failed."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from mpsched._client.link import DISCONNECTED
from mpsched._errors import ManagerUnreachableError
from mpsched._protocol.proxy import ServiceProxy, connect_service
from mpsched._transport.address import format_address, parse_address
from mpsched._transport.runtime import default_address, require_authkey

C = TypeVar("C")


def dial(
    address: str | tuple[str, int] | None, authkey: bytes | str | None
) -> tuple[ServiceProxy, Callable[[], ServiceProxy], str]:
    """The manager's proxy, a callable that connects to it again, and its address as
    shown; ``address`` and ``authkey`` as ``connect()`` takes them, and raises."""
    if address is None:
        address = default_address()
    elif isinstance(address, str):
        address = parse_address(address)
    if isinstance(authkey, str):  # the text of a key file: its bytes are UTF-8
        authkey = authkey.encode()
    # Surrounding whitespace is stripped, as from a key file (its trailing newline).
    key = authkey.strip() if authkey is not None else require_authkey(address, give="pass authkey=")
    try:
        service = connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (*DISCONNECTED, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc
    return service, functools.partial(connect_service, address, key), format_address(address)


def opened(make: Callable[[], C], service: ServiceProxy, shown: str) -> C:
    """``make()``, the client of ``service`` (at ``shown``); if the manager stops
    answering meanwhile, ``service`` is discarded and ManagerUnreachableError raised."""
    try:
        return make()
    except ManagerUnreachableError:  # dropped a thread's connection: it said why
        service.discard()
        raise
    except DISCONNECTED as exc:
        # It answered the first connection, then not the client's threads' (a stall
        # longer than a handshake may take, or it went away).
        service.discard()
        raise ManagerUnreachableError(
            shown,
            "it answered, then stopped answering while the client "
            f"opened its connections ({type(exc).__name__}: {exc})",
        ) from exc
