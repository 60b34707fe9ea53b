"""TLS for manager connections over TCP (stdlib ``ssl``), on top of the HMAC authkey.

Without TLS, everything after the handshake (job payloads, results, the proxy calls
themselves) crosses the network as plaintext pickles: anyone on the path can read it, and
the authkey only proves who connected. With TLS, every TCP connection a process makes or
accepts through mpsched is encrypted before the authkey handshake starts; the authkey is
still required on top. Unix sockets never use TLS: they do not leave the machine, and their
file mode (0600) keeps other users out.

The setting is process-wide (:func:`set_tls`), because ``multiprocessing.managers`` opens
connections itself (one per proxy and thread) and gives us no way to pass options along:

- a server takes the setting in force when its listener is created, and keeps it;
- a client connection takes the setting in force when it connects.

Trust model: a certificate is accepted when it chains to ``ca`` (the system's CAs when the
client gives none). Host names are *not* checked: proxies reconnect to the address the
manager reports for itself (``0.0.0.0:7000`` when it listens on every interface), which no
certificate names. Use a private CA that signs only mpsched's certificates.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from mpsched._errors import TlsError
from mpsched._transport.authkey import private_file_problem


@dataclass(frozen=True)
class TlsConfig:
    """Certificate files for TLS; all PEM.

    Attributes:
        cert: this side's certificate (a server needs one; a client sends it when the
            server asks for client certificates).
        key: the private key of ``cert`` (None: it is in the ``cert`` file). The file that
            holds it must be this user's and unreadable by group and others (mode 0600),
            as an authkey file.
        ca: the CA that signs the peer's certificate. A client verifies the server with it
            (None: the system's CAs; give a self-signed certificate as its own CA). A server
            given one requires every client to present a certificate it signed.
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    def for_local_workers(self) -> TlsConfig:
        """What the workers a TLS manager starts itself connect with: its own certificate
        (so a manager that requires client certificates signed by ``ca`` accepts them), and
        ``ca`` (or, for a self-signed certificate, the certificate itself) to verify it."""
        return TlsConfig(cert=self.cert, key=self.key, ca=self.ca or self.cert)

    def server_context(self) -> ssl.SSLContext:
        """The context a manager wraps accepted connections in.

        Raises:
            TlsError: no ``cert``, or a file that does not load.
        """
        if self.cert is None:
            raise TlsError("serving TLS needs a certificate and its key (--tls-cert, --tls-key)")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.num_tickets = 0  # nobody resumes sessions; tickets would only be noise
        self._load_chain(context)
        if self.ca is not None:
            self._load_ca(context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """The context a client wraps its connections in: it verifies the server against
        ``ca`` and presents ``cert`` if there is one.

        Raises:
            TlsError: a file that does not load.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server's chain
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False  # see the module docstring
        if self.ca is not None:
            self._load_ca(context)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if self.cert is not None:
            self._load_chain(context)
        return context

    def _load_chain(self, context: ssl.SSLContext) -> None:
        self._check_key_file()
        try:
            context.load_cert_chain(str(self.cert), None if self.key is None else str(self.key))
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(
                f"cannot load TLS certificate {self.cert} with key "
                f"{self.key or '(in the certificate file)'}: {exc}"
            ) from None

    def _check_key_file(self) -> None:
        """Refuse a private key that another user owns or others can read, as an authkey
        file is refused (a file that cannot be read is left to ``load_cert_chain``)."""
        path = self.key if self.key is not None else self.cert
        assert path is not None  # only a config with a certificate loads a chain
        what = (
            f"TLS key file {path}"
            if self.key is not None
            else f"TLS certificate file {path}, which holds its key (no key file),"
        )
        try:
            with open(path, "rb") as file:
                status = os.fstat(file.fileno())
        except OSError:
            return
        problem = private_file_problem(what, status)
        if problem:
            raise TlsError(problem)

    def _load_ca(self, context: ssl.SSLContext) -> None:
        try:
            context.load_verify_locations(cafile=str(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load TLS CA file {self.ca}: {exc}") from None


@dataclass(frozen=True)
class ClientTls:
    """The process's TLS setting with its client context, built once."""

    config: TlsConfig
    context: ssl.SSLContext


_lock = threading.Lock()  # guards _client; held only to swap it (readers take a reference)
_client: ClientTls | None = None


def set_tls(config: TlsConfig | None) -> TlsConfig | None:
    """Use TLS with ``config`` (None: no TLS) for the TCP connections this process makes
    from now on, and for servers it creates from now on; returns the previous setting.

    Raises:
        TlsError: a certificate, key or CA file that does not load (nothing changes then).
    """
    global _client
    settings = None if config is None else ClientTls(config, config.client_context())
    with _lock:
        previous, _client = _client, settings
    return None if previous is None else previous.config


def current_tls() -> TlsConfig | None:
    """The setting :func:`set_tls` made, or None."""
    settings = _client
    return None if settings is None else settings.config


def client_tls() -> ClientTls | None:
    """The setting with its client context, for a connection being opened now."""
    return _client
