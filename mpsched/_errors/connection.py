"""The errors of reaching a manager: its address, its key, TLS, its answer and its versions."""

from __future__ import annotations

import errno
import multiprocessing
import socket

from mpsched._errors.base import MpschedError, SchedulerShutdownError


class AuthenticationError(MpschedError, multiprocessing.AuthenticationError):
    """The manager and this process do not share the authkey, or the key is unsafe."""


class TlsError(AuthenticationError):
    """TLS could not be set up: a certificate did not verify, a peer does not speak TLS or
    wants a client certificate, a certificate or key file does not load, or the key file
    is another user's or readable by others."""


class RuntimeDirError(AuthenticationError, PermissionError):
    """The local manager's runtime directory (its socket and key) is unsafe to use: not a
    directory, another user's, or open to others. ``path`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"refusing the runtime directory {path}: {problem}")

    def __reduce__(self) -> tuple[type[RuntimeDirError], tuple[str, str]]:
        return (type(self), (self.path, self.problem))


class AddressError(MpschedError, ValueError):
    """An address string that is neither ``unix:PATH`` nor ``HOST:PORT``."""


class ManagerUnreachableError(MpschedError, ConnectionError):
    """No mpsched manager answers at an address; ``reason`` says what is there instead.

    Build it with :meth:`from_error` from what connecting raised: an unknown host, nothing
    listening, something listening that is not an mpsched manager, or a manager that
    dropped every handshake the client tried (a ManagerBusyError), saying so.
    """

    _SAYS = "no manager answers at {address}: {reason}"

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(self._SAYS.format(address=address, reason=reason))

    def __reduce__(self) -> tuple[type[ManagerUnreachableError], tuple[str, str]]:
        return (type(self), (self.address, self.reason))

    @classmethod
    def from_error(cls, address: str, exc: BaseException) -> ManagerUnreachableError:
        """Say what connecting to ``address`` (as the command line spells it) ran into.

        Failures to connect (name lookup, refused, no socket file, no route) say so; a
        manager that turned us away said why (``exc`` is then this error already);
        anything else that goes wrong once connected (silence until the handshake
        deadline, a hang-up, bytes that are not a challenge) means the peer is not an
        mpsched manager.
        """
        if isinstance(exc, ManagerBusyError):
            return ManagerBusyError(address, exc.reason)
        if isinstance(exc, ManagerUnreachableError):
            return cls(address, exc.reason)
        if isinstance(exc, socket.gaierror):
            host = address.rpartition(":")[0]
            return cls(address, f"unknown host {host} ({exc.strerror})")
        if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
            what = "no such socket file" if isinstance(exc, FileNotFoundError) else exc.strerror
            return cls(address, f"nothing is listening there ({what})")
        if isinstance(exc, PermissionError):
            return cls(address, f"no permission to connect ({exc.strerror})")
        if isinstance(exc, OSError) and exc.errno in _NO_ROUTE:
            return cls(address, f"cannot reach the host ({exc.strerror})")
        # A manager serving TLS stays silent until the client speaks TLS, then hangs up at
        # its handshake deadline: the transport says so when the client had no TLS.
        tls = "; if it serves TLS, connect with --tls-ca" if "TLS" in str(exc) else ""
        if isinstance(exc, (BlockingIOError, TimeoutError)):
            how = f"it sent no handshake in time{tls}"
        elif isinstance(exc, (EOFError, ConnectionError)):
            how = f"it hung up during the handshake{tls}"
        else:
            how = f"it sent something else: {exc}"
        return cls(address, f"what listens there is not an mpsched manager ({how})")


class ManagerBusyError(ManagerUnreachableError):
    """A manager answers at an address, but closed each connection the client opened during
    its handshake, for as long as the client kept trying: it made room for newer
    connections (a flood of idle ones from the client's address, say), or it was stopping.
    ``reason`` says what happened last. Trying again later may succeed."""

    _SAYS = "the manager at {address} is busy: {reason}; try again later"


class ManagerConnectionLostError(ManagerUnreachableError, SchedulerShutdownError):
    """A client lost the connection to its manager at ``address`` (it died, stopped, or
    the network failed): ``reason`` says how, ``advice`` what became of the job or call and
    what to do. Also a SchedulerShutdownError, which clients raised for this before.

    A client of ``mpsched.connect()`` reconnects by itself; until it has, its submits
    raise this at once. A Scheduler's manager is not restarted: its client stays closed.
    """

    def __init__(self, address: str, reason: str, advice: str = "") -> None:
        self.address = address
        self.reason = reason
        self.advice = advice
        ConnectionError.__init__(
            self,
            f"lost the connection to the manager at {address} "
            f"({reason})" + (f"; {advice}" if advice else ""),
        )

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[
        type[ManagerConnectionLostError],
        tuple[str, str, str],
    ]:
        return (type(self), (self.address, self.reason, self.advice))


# connect() failures that mean the host itself cannot be reached
_NO_ROUTE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ETIMEDOUT})


class VersionMismatchError(MpschedError):
    """A worker or client runs another Python minor or cloudpickle version than its manager.

    Pickles of code are not portable across those, so the peer is refused.
    """

    def __init__(self, peer: str, mine: tuple[str, str], theirs: tuple[str, str]) -> None:
        self.peer = peer
        self.mine = mine
        self.theirs = theirs
        super().__init__(
            f"{peer} runs Python {theirs[0]} with cloudpickle {theirs[1]}, but the manager "
            f"runs Python {mine[0]} with cloudpickle {mine[1]}: use the same versions"
        )

    def __reduce__(
        self,
    ) -> tuple[type[VersionMismatchError], tuple[str, tuple[str, str], tuple[str, str]]]:
        return (type(self), (self.peer, self.mine, self.theirs))


class WorkerRetiredError(MpschedError):
    """The manager declared this worker gone (missed heartbeats); it must join again."""
