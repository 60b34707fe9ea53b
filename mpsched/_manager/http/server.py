"""StatusServer: the manager's HTTP status server, in threads of the manager process.

```
 browser / Prometheus / curl          manager process
   GET /, /metrics, /api/... ──▶  mpsched-http thread: accept, TLS, request heads, caps,
                                  deadlines, for every waiting connection (no thread each)
                                  a thread per request being answered (MAX_ANSWERING):
                                    Host and token checks, body (<= MAX_BODY bytes),
                                    Routes.answer() ──▶ copies of the service's counters
```

Stdlib ``http.server`` parses and answers: the server answers a handful of small requests
a second, which needs no framework, and a dependency would make ``--http`` an extra to
install. What the stdlib leaves open is closed here:

- a connection waiting for a request (idle kept-alive, or its request unfinished) holds
  a descriptor and no thread: the accepting thread (mpsched._manager.http.intake) runs
  its TLS handshake and reads its request's head without blocking. A thread answers it
  once the whole head has arrived;
- at most MAX_CONNECTIONS connections (MAX_PER_ADDRESS from one IP address, counted by
  mpsched._manager.http.connections): past a cap, a new connection closes the oldest
  waiting one, so idle connections cannot keep a scraper out; a request that has arrived
  is answered;
- each connection has a deadline, REQUEST_TIME from when it was accepted or last
  answered, past which it is shut down, so a client that trickles a byte at a time
  (slowloris) or reads its answer that way is cut off then; each read or write of a
  thread waits IO_TIMEOUT at most;
- a request's line and headers take MAX_HEAD bytes at most, a body MAX_BODY (actions
  need none);
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
import socket
import ssl
import threading
from http import HTTPStatus
from typing import Any

from mpsched._manager.http.answering import Answering, RequestReader, TooLarge
from mpsched._manager.http.connections import Connection, Connections
from mpsched._manager.http.history import LatenessHistory
from mpsched._manager.http.intake import MAX_HEAD, Intake, whole_head
from mpsched._manager.http.routes import TEXT, HttpError, Response, Routes, load_page
from mpsched._manager.http.views import Views
from mpsched._manager.service import ManagerService
from mpsched._transport.http_access import HttpConfig
from mpsched._transport.tls import TlsConfig

log = logging.getLogger("mpsched.http")

IO_TIMEOUT = 5.0  # seconds one read or write may wait
MAX_BODY = 1024  # bytes of a request body
LISTEN_BACKLOG = 128  # connections the kernel holds for accept()
STOP_WAIT = 2.0  # seconds stop() waits for the connections' threads
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
)


class StatusAddressError(OSError):
    """The status server's address cannot be bound (in use, or not this host's)."""

    def __init__(self, where: str, cause: OSError) -> None:
        super().__init__(
            cause.errno, f"cannot serve the status page on {where}: {cause.strerror or cause}"
        )


class StatusServer:
    """The status server of one manager: binds at construction, serves after start()."""

    def __init__(self, config: HttpConfig, service: ManagerService) -> None:
        """Raises OSError: the address cannot be bound; TlsError: TLS files do not load."""
        history = LatenessHistory(service.queue.leases.lateness_histogram)
        routes = Routes(Views(service, history), service, load_page())
        tls = None if config.tls is None else _context(config.tls)
        self._listener = _Listener(config, routes, tls)
        self.url = config.url(self._listener.server_address[1])
        self._thread = threading.Thread(
            target=self._listener.intake.run, name="mpsched-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("status page and metrics at %s", self.url)

    def stop(self) -> None:
        """Stop accepting, end every connection, wait (briefly) for their threads."""
        self._listener.intake.stop()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT)
        self._listener.socket.close()
        self._listener.connections.end_all(STOP_WAIT)


def _context(tls: TlsConfig) -> ssl.SSLContext:
    """HTTPS with the manager's certificate; browsers bring no client certificate, so none
    is asked for (the token is the credential)."""
    context = TlsConfig(cert=tls.cert, key=tls.key).server_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


class _Listener:
    """The status server's socket, and what its threads share."""

    def __init__(self, config: HttpConfig, routes: Routes, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.routes = routes
        self.tls = tls
        self.connections = Connections()  # open ones, their caps and deadlines
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((config.host, config.port))
            self.socket.listen(LISTEN_BACKLOG)
        except BaseException:
            self.socket.close()
            raise
        self.server_address: tuple[str, int] = self.socket.getsockname()
        self.answering = Answering(self._answer, self._drop)
        self.intake = Intake(self.socket, self.connections, tls, self.answering.start)

    def _answer(self, connection: Connection) -> None:
        """In a thread: answer the requests whose heads ``connection`` holds, then give it
        back to wait for the next (or close it)."""
        while True:
            try:
                keep = not _Handler(connection, self).close_connection
            except Exception:  # a peer that went away mid-answer, or a TLS error
                log.debug(
                    "status server: a connection from %s ended with an error",
                    connection.host,
                    exc_info=True,
                )
                keep = False
            if not keep or connection.ended:
                self._drop(connection)
                return
            self.connections.answered(connection)
            if not whole_head(connection.head):  # no other request came along with it
                self.intake.give_back(connection)
                return

    def _drop(self, connection: Connection) -> None:
        self.connections.remove(connection)
        connection.sock.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers one request of a connection (constructing it does), whose head the
    accepting thread has read."""

    protocol_version = "HTTP/1.1"  # keep-alive: the page polls once a second
    server_version = "mpsched"  # and no Python version: see version_string()
    # Buffered, and flushed once per answer: its head and body leave in one segment. (Sent
    # apart, the body waited for the ACK of the head, which a client delays by 40 ms.)
    wbufsize = 64 * 1024
    server: _Listener  # type: ignore[assignment]
    rfile: Any  # a RequestReader

    def __init__(self, connection: Connection, server: _Listener) -> None:
        self._connection = connection
        super().__init__(connection.sock, (connection.host, connection.port), server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(IO_TIMEOUT)  # each read or write (TLS too)
        self.rfile = RequestReader(self._connection)
        self.wfile = self.connection.makefile("wb", self.wbufsize)

    def handle(self) -> None:
        self.close_connection = True  # unless the request keeps it alive
        self.handle_one_request()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.wfile.close()

    def handle_one_request(self) -> None:
        self.command = self.requestline = self.request_version = ""  # until parsed
        try:
            self.raw_requestline = self.rfile.readline()
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return  # it answered the error
        except TooLarge:
            self.send_error(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"request line and headers take more than {MAX_HEAD} bytes",
            )
            return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        self._send(self._response())

    def version_string(self) -> str:
        return self.server_version

    def handle_expect_100(self) -> bool:
        answered = super().handle_expect_100()
        self.wfile.flush()  # the writer is buffered: "100 Continue" must go now
        return answered

    def _response(self) -> Response:
        try:
            if self.command not in ("GET", "HEAD", "POST"):
                raise HttpError(
                    405,
                    f"{self.command} is not served: use GET (or POST for actions)",
                    (("Allow", "GET, HEAD, POST"),),
                )
            self._check_host()
            may_act = self._check_token()
            self._skip_body()
            method = "GET" if self.command == "HEAD" else self.command  # _send drops the body
            return self.server.routes.answer(method, self.path, may_act=may_act)
        except HttpError as exc:
            return _error(exc.status, exc.message, exc.headers)
        except Exception:
            log.exception("status server: %s %s failed", self.command, self.path[:200])
            return _error(500, "internal error of the status server; the manager's log says which")

    def _check_host(self) -> None:
        """Without a token, answer only requests for a loopback host: a page elsewhere whose
        name was rebound to 127.0.0.1 sends its own name (DNS rebinding)."""
        host = self.headers.get("Host")
        if self.server.config.token is not None or host is None:
            return
        name = (
            host[1 : host.find("]")]
            if host.startswith("[")
            else host.rpartition(":")[0]
            if ":" in host
            else host
        )
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
            given.strip().encode("latin-1", "replace"), token
        ):
            return True
        if self.command in ("GET", "HEAD") and self.path.partition("?")[0] == "/":
            return False
        raise HttpError(
            401,
            "this server needs its token: send Authorization: Bearer TOKEN"
            if sent is None
            else "wrong token: this server takes the one in its "
            "--http-token-file, as Authorization: Bearer TOKEN",
            (("WWW-Authenticate", 'Bearer realm="mpsched"'),),
        )

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

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's errors (a request that does not parse) as a status and one line."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # which would get a body without a status
            self.request_version = ""
        self._send(_error(code, message or HTTPStatus(code).phrase))

    def _send(self, response: Response) -> None:
        try:
            self.send_response(response.status)
            headers = [
                ("Content-Type", response.content_type),
                ("Content-Length", str(len(response.body))),
                *SECURITY_HEADERS,
                *response.headers,
            ]
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
    return Response(status=status, content_type=TEXT, body=f"{line}\n".encode(), headers=headers)
