"""The options every command that reaches a manager shares: its address, its key and TLS.

Each command's own options are in a module of their own (:mod:`mpsched._cli.serve_options`,
:mod:`mpsched._cli.submit_options`, :mod:`mpsched._cli.query_options`,
:mod:`mpsched._cli.stress_options`), and the types that read their values in
:mod:`mpsched._cli.values`. :mod:`mpsched._cli.parser` puts them together.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from mpsched._transport.authkey import AUTHKEY_ENV
from mpsched._transport.tls import TlsConfig

CONNECT_HELP = (
    "the manager's address, as serve prints it: unix:PATH or HOST:PORT "
    "(default: this user's local manager)"
)
KEY_HELP = (
    f"file holding the manager's key, mode 0600 (default: ${AUTHKEY_ENV}, else, "
    f"for a local address, this user's local key)"
)


def tls_options(p: argparse.ArgumentParser, *, serving: bool) -> None:
    """The --tls-* options: a server's certificate with ``serving``, else a client's."""
    group = p.add_argument_group(
        "TLS (TCP addresses only; the authkey is still required)",
        textwrap.fill(
            "Without TLS, traffic after the authkey handshake is plaintext "
            "pickles: use it on any network you do not trust. Files are PEM.",
            77,
        )
        if serving
        else None,
    )
    if serving:
        group.add_argument(
            "--tls-cert",
            type=Path,
            metavar="FILE",
            help="serve TLS with this certificate (its local workers verify "
            "it with --tls-ca, or with the certificate itself when it "
            "is self-signed); --http serves HTTPS with it too",
        )
        group.add_argument(
            "--tls-key",
            type=Path,
            metavar="FILE",
            help="the certificate's private key (default: in --tls-cert)",
        )
        group.add_argument(
            "--tls-ca",
            type=Path,
            metavar="FILE",
            help="require every client and worker to present a certificate signed by this CA",
        )
    else:
        group.add_argument(
            "--tls-ca",
            type=Path,
            metavar="FILE",
            help="connect with TLS and verify the manager's certificate with "
            "this CA (a self-signed certificate is its own CA)",
        )
        group.add_argument(
            "--tls-cert",
            type=Path,
            metavar="FILE",
            help="the client certificate to present, if the manager requires one",
        )
        group.add_argument(
            "--tls-key",
            type=Path,
            metavar="FILE",
            help="that certificate's private key (default: in --tls-cert)",
        )


def client_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a running manager: where, key, TLS."""
    p.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    p.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    tls_options(p, serving=False)
    return p


def tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS setting the --tls-* options ask for; None without any of them."""
    cert, key, ca = (getattr(args, f"tls_{name}", None) for name in ("cert", "key", "ca"))
    return None if not (cert or key or ca) else TlsConfig(cert=cert, key=key, ca=ca)
