"""How a command of ``python -m mpsched`` reaches its manager: ``--connect`` (default: this
user's local manager) and its key, as a proxy or as a client."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from mpsched._client.client import Client, connect
from mpsched._errors import ManagerUnreachableError
from mpsched._protocol.proxy import ServiceProxy, connect_service
from mpsched._transport.address import Address, format_address, parse_address
from mpsched._transport.runtime import default_address, require_authkey


def manager_of(args: argparse.Namespace) -> tuple[Address, bytes]:
    """The manager a client command talks to and its key: ``--connect`` (default: this
    user's local manager) with ``--authkey-file``, else $MPSCHED_AUTHKEY, else (for a local
    address) this user's local key.

    Raises:
        AddressError: ``--connect`` does not parse.
        AuthenticationError: no key, or an unsafe key file or runtime directory.
        ManagerUnreachableError: no address given, and no local manager has ever run.
    """
    address = parse_address(args.connect) if args.connect else default_address()
    return address, require_authkey(
        address, args.authkey_file, give="give --authkey-file (mode 0600)"
    )


def service_at(address: Address, key: bytes) -> ServiceProxy:
    """``connect_service``, with a failure to reach a manager said as what it was.

    Raises:
        ManagerUnreachableError: unknown host, nothing listening, or not a manager.
        AuthenticationError: the manager refused the key.
    """
    try:
        return connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (EOFError, OSError, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[Client]:
    """A client of ``--connect``, detached on the way out: it leaves every job queued."""
    address, key = manager_of(args)
    client = connect(address, authkey=key)
    try:
        yield client
    finally:
        client.detach()
