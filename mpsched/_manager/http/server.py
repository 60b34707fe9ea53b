"""StatusServer: the manager's HTTP status server, in threads of the manager process.

```
 browser / Prometheus / curl          manager process
   GET /, /metrics, /api/... ──▶  mpsched-http thread: accept, caps, deadlines
                                  one thread per connection (at most MAX_CONNECTIONS):
                                    TLS, head (<= MAX_HEAD bytes), Host and token checks,
                                    Routes.answer() ──▶ copies of the service's counters
```

Stdlib ``http.server`` in threads: the server answers a handful of small requests a
second, which needs no framework, and a dependency would make ``--http`` an extra to
install. What the stdlib leaves open is closed here:

- at most MAX_CONNECTIONS connections (MAX_PER_ADDRESS from one IP address, counted by
  mpsched._manager.http.connections); one over a cap gets a 503 (over TLS: a closed
  connection) from the accepting thread, which never reads from or waits on a client;
- each connection has a deadline, REQUEST_TIME from when it was accepted or last
  answered: the accepting thread (which sleeps until the next deadline or connection, so
  an idle server costs nothing) shuts down a connection past it, so a client that
  trickles a byte at a time (slowloris) or reads its answer that way holds a thread for
  that long at most; each read or write waits IO_TIMEOUT at most;
- a request's line and headers take MAX_HEAD bytes at most, a body MAX_BODY (actions
  need none);
- TLS handshakes run in the connection's thread, never in the accepting one;
- every answer to a bad request is a status and one line of text; an error of the
  server's own is logged once and answered 500, never with a traceback.

Nothing here holds the queue's lock: the views take copies through the service's
methods, each holding its lock for the copy alone.
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import ipaddress
import logging
import selectors
import socket
import socketserver
import ssl
import threading
from http import HTTPStatus
from typing import Any, BinaryIO

from mpsched._manager.http.connections import Connections
from mpsched._manager.http.history import LatenessHistory
from mpsched._manager.http.routes import TEXT, HttpError, Response, Routes, load_page
from mpsched._manager.http.views import Views
from mpsched._manager.service import ManagerService
from mpsched._transport.http_access import HttpConfig
from mpsched._transport.tls import TlsConfig

log = logging.getLogger("mpsched.http")

IO_TIMEOUT = 5.0  # seconds one read or write may wait
MAX_HEAD = 16 * 1024  # bytes of a request line and headers
MAX_BODY = 1024  # bytes of a request body
STOP_WAIT = 2.0  # seconds stop() waits for the connections' threads
SECURITY_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                    ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"))


class StatusAddressError(OSError):
    """The status server's address cannot be bound (in use, or not this host's)."""

    def __init__(self, where: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot serve the status page on {where}: "
                                      f"{cause.strerror or cause}")


class StatusServer:
    """The status server of one manager: binds at construction, serves after start()."""

    def __init__(self, config: HttpConfig, service: ManagerService) -> None:
        """Raises OSError: the address cannot be bound; TlsError: TLS files do not load."""
        history = LatenessHistory(service.queue.leases.lateness_histogram)
        routes = Routes(Views(service, history), service, load_page())
        tls = None if config.tls is None else _context(config.tls)
        self._listener = _Listener(config, routes, tls)
        self.url = config.url(self._listener.server_address[1])
        self._thread = threading.Thread(target=self._listener.serve, name="mpsched-http",
                                         daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("status page and metrics at %s", self.url)

    def stop(self) -> None:
        """Stop accepting, end every connection, wait (briefly) for their threads."""
        self._listener.stop_serving()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT)
        self._listener.server_close()
        self._listener.connections.end_all(STOP_WAIT)


def _context(tls: TlsConfig) -> ssl.SSLContext:
    """HTTPS with the manager's certificate; browsers bring no client certificate, so none
    is asked for (the token is the credential)."""
    context = TlsConfig(cert=tls.cert, key=tls.key).server_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


class _Listener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False  # Connections.end_all() ends the connections' threads, with a bound
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, config: HttpConfig, routes: Routes, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.routes = routes
        self.tls = tls
        self.connections = Connections()  # open ones, their caps and deadlines
        # Set by stop_serving(), which then writes to _waker to wake the accepting thread.
        self._stopping = threading.Event()
        self._wake, self._waker = socket.socketpair()
        super().__init__((config.host, config.port), _Handler)

    # -------------------------------------------------- the accepting thread's side

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self.connections.admit(request, str(client_address[0])):
            return True
        if self.tls is None:  # over TLS there is no way to say why without a handshake
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain"
                             b"\r\nContent-Length: 21\r\nConnection: close\r\n\r\n"
                             b"too many connections\n")
        return False

    def serve(self) -> None:
        """The accepting thread: accept connections, and end those past their deadline. It
        sleeps until a connection comes, the next deadline, or stop_serving(): an idle
        server never wakes up."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(self.connections.end_late()):
                    if key.fileobj is self.socket:
                        self._handle_request_noblock()  # type: ignore[attr-defined]

    def stop_serving(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._waker.send(b"x")

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("status server: connection from %s ended with an error",
                  client_address[0], exc_info=True)

    def shutdown_request(self, request: Any) -> None:
        sock = self.connections.remove(request)
        if sock is not None and sock is not request:
            with contextlib.suppress(OSError):
                sock.close()  # the TLS socket, which owns the descriptor
        super().shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self._wake.close()
        self._waker.close()



class _TooLarge(Exception):
    """A request's head passed MAX_HEAD bytes."""


class _CappedReader:
    """A connection's reader that lets each request's head take MAX_HEAD bytes at most."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._left = MAX_HEAD

    def next_request(self) -> None:
        self._left = MAX_HEAD

    def readline(self, limit: int = -1) -> bytes:
        if self._left < 0:
            raise _TooLarge
        size = self._left + 1 if limit < 0 else min(limit, self._left + 1)
        line = self._raw.readline(size)
        self._left -= len(line)
        if self._left < 0:
            raise _TooLarge
        return line

    def read(self, size: int) -> bytes:
        return self._raw.read(size)

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._raw.closed


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the page polls once a second
    server_version = "mpsched"  # and no Python version: see version_string()
    # Buffered, and flushed once per answer: its head and body leave in one segment. (Sent
    # apart, the body waited for the ACK of the head, which a client delays by 40 ms.)
    wbufsize = 64 * 1024
    server: _Listener
    rfile: Any  # a _CappedReader

    def setup(self) -> None:
        self._raw = self.request
        self._raw.settimeout(IO_TIMEOUT)
        with contextlib.suppress(OSError):
            self._raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.server.tls is not None:  # here, not in the accepting thread
            self.request = self.server.tls.wrap_socket(self._raw, server_side=True,
                                                       do_handshake_on_connect=False)
            # Its deadline bounds the handshake.
            self.server.connections.wrapped(self._raw, self.request)
            self.request.do_handshake()
        super().setup()
        self.connection.settimeout(IO_TIMEOUT)  # each read or write (TLS too)
        self.rfile = _CappedReader(self.rfile)

    def handle_one_request(self) -> None:
        self.rfile.next_request()
        self.command = self.requestline = self.request_version = ""  # until parsed
        try:
            self.raw_requestline = self.rfile.readline()
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return  # it answered the error
        except _TooLarge:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                            f"request line and headers take more than {MAX_HEAD} bytes")
            return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        self._send(self._response())
        self.server.connections.answered(self._raw)

    def version_string(self) -> str:
        return self.server_version

    def handle_expect_100(self) -> bool:
        answered = super().handle_expect_100()
        self.wfile.flush()  # the writer is buffered: "100 Continue" must go now
        return answered

    def _response(self) -> Response:
        try:
            if self.command not in ("GET", "HEAD", "POST"):
                raise HttpError(405, f"{self.command} is not served: use GET (or POST for "
                                     f"actions)", (("Allow", "GET, HEAD, POST"),))
            self._check_host()
            may_act = self._check_token()
            self._skip_body()
            method = "GET" if self.command == "HEAD" else self.command  # _send drops the body
            return self.server.routes.answer(method, self.path, may_act=may_act)
        except HttpError as exc:
            return _error(exc.status, exc.message, exc.headers)
        except Exception:
            log.exception("status server: %s %s failed", self.command, self.path[:200])
            return _error(500, "internal error of the status server; the manager's log "
                               "says which")

    def _check_host(self) -> None:
        """Without a token, answer only requests for a loopback host: a page elsewhere whose
        name was rebound to 127.0.0.1 sends its own name (DNS rebinding)."""
        host = self.headers.get("Host")
        if self.server.config.token is not None or host is None:
            return
        name = host[1:host.find("]")] if host.startswith("[") else host.rpartition(":")[0] \
            if ":" in host else host
        if name.lower() in ("localhost", self.server.config.host.lower()):
            return
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(name).is_loopback:
                return
        raise HttpError(421, f"this server answers for loopback host names, not {name!r}")

    def _check_token(self) -> bool:
        """With a token: True if the request carries it (it may act), else 401, except for
        the page itself (``GET /``: its code, no data). Without one: False."""
        token = self.server.config.token
        if token is None:
            return False
        sent = self.headers.get("Authorization")
        scheme, _, given = (sent or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
                given.strip().encode("latin-1", "replace"), token):
            return True
        if self.command in ("GET", "HEAD") and self.path.partition("?")[0] == "/":
            return False
        raise HttpError(401, "this server needs its token: send Authorization: Bearer TOKEN"
                        if sent is None else "wrong token: this server takes the one in its "
                        "--http-token-file, as Authorization: Bearer TOKEN",
                        (("WWW-Authenticate", 'Bearer realm="mpsched"'),))

    def _skip_body(self) -> None:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HttpError(411, "send a Content-Length (no request needs a body)")
        length = self.headers.get("Content-Length", "0").strip() or "0"
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY:
            self.close_connection = True
            raise HttpError(413, f"a request body takes {MAX_BODY} bytes at most")
        try:
            if int(length) and len(self.rfile.read(int(length))) < int(length):
                raise EOFError
        except (OSError, EOFError):  # a timeout, or the peer went away
            self.close_connection = True
            raise HttpError(408, "the request's body did not come in time") from None

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The stdlib's errors (a request that does not parse) as a status and one line."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # which would get a body without a status
            self.request_version = ""
        self._send(_error(code, message or HTTPStatus(code).phrase))

    def _send(self, response: Response) -> None:
        try:
            self.send_response(response.status)
            headers = [("Content-Type", response.content_type),
                       ("Content-Length", str(len(response.body))), *SECURITY_HEADERS,
                       *response.headers]
            if self.close_connection:
                headers.append(("Connection", "close"))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("status server: %s %s", self.client_address[0], format % args)


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    line = "".join(c if c.isprintable() else "?" for c in message)
    return Response(status=status, content_type=TEXT, body=f"{line}\n".encode(),
                    headers=headers)
