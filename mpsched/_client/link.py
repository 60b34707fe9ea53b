"""A client's link to its manager: the proxy it calls, the outages, and the way back.

A client of ``mpsched.connect()`` whose manager goes away (killed, stopped, restarted at
night, a network cut) reconnects by itself: :meth:`ManagerLink.reconnect` tries the same
address with back-off, RECONNECT_FIRST seconds doubling to RECONNECT_MAX, until a manager
answers there and takes the client back under its own id, or the client closes. Meanwhile
every call made through :meth:`ManagerLink.ask` raises ManagerConnectionLostError at once.
What becomes of the client's futures meanwhile is mpsched._client.outage's to decide.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from mpsched._core.job import Outcome
from mpsched._errors import ManagerConnectionLostError, StoreError
from mpsched._protocol.proxy import (
    ServiceProxy,
)
from mpsched._protocol.records import (
    ClientHello,
)
from mpsched._store.base import IN_MEMORY
from mpsched._transport.address import format_address
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.client")

T = TypeVar("T")

RECONNECT_FIRST = 0.1  # seconds before the first try to reach a lost manager again
RECONNECT_MAX = 5.0  # the wait doubles up to this
# The manager is gone; OSError covers ConnectionError. (A StoreError is an OSError too, but
# one the manager raised: every handler of these lets it through first.)
DISCONNECTED = (EOFError, OSError)


@dataclass(frozen=True)
class Outage:
    """A lost connection to the manager at ``address`` (as the command line spells it)."""

    address: str
    reason: str  # how it was lost: "EOFError", "the manager stopped", ...
    since: float  # time.monotonic() when it was noticed

    def error(self, advice: str) -> ManagerConnectionLostError:
        return ManagerConnectionLostError(self.address, self.reason, advice)


class Rejoin(NamedTuple):
    """A manager that took a client back."""

    service: ServiceProxy
    durable: bool  # it keeps a store
    outcomes: list[Outcome]  # of the jobs asked about that have ended
    unknown: list[str]  # the ids of those it does not know
    sender: FastConnection | None  # the outbox sender's connection there, opened already


def describe(exc: BaseException) -> str:
    """How a call that lost its connection failed, in a few words."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def has_store(service: ServiceProxy) -> bool:
    """Whether the manager keeps a store (then it knows a client's jobs after a restart)."""
    return service.stats().store != IN_MEMORY


class ManagerLink:
    """The proxy a client calls its manager through, and the outages of that connection.

    :meth:`lost` starts an outage when a call through the current proxy lost its
    connection and the client can reconnect; :meth:`ask` then raises at once; the result
    thread :meth:`reconnect` s, swaps the proxy (:meth:`rejoined`) and ends the outage
    (:meth:`restored`).
    """

    def __init__(
        self,
        service: ServiceProxy,
        hello: ClientHello,
        connect: Callable[[], ServiceProxy] | None,
        lost_advice: str,
        *,
        on_outage: Callable[[], None] | None = None,
    ) -> None:
        """``connect``: connects to the same address again (None: this client does not
        reconnect; its errors end with ``lost_advice``); ``on_outage``: called when
        :meth:`lost` starts an outage."""
        self.service = service
        self.address = format_address(service.manager_address)
        self.hello = hello
        self._connect = connect
        self._lost_advice = lost_advice or "connect again once a manager answers there"
        # Guards service and outage while they change (readers take a plain look: they
        # see one value or the other). Held briefly; nobody waits on it.
        self._lock = threading.Lock()
        self.outage: Outage | None = None  # the manager is unreachable since then
        self.gone: ManagerConnectionLostError | None = None  # the client closed on a loss
        # Set once the client closes (close()): a reconnect waiting out its back-off gives up.
        self.closed = threading.Event()
        self._on_outage = on_outage
        # The manager keeps a store: it knows the client's jobs after a restart.
        self.durable = connect is not None and has_store(service)

    @property
    def reconnects(self) -> bool:
        return self._connect is not None and not self.closed.is_set()

    def ask(self, call: Callable[[ServiceProxy], T]) -> T:
        """``call(service)`` on the manager. A lost connection raises
        ManagerConnectionLostError (and starts an outage); during one, so does this, at
        once."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        service = self.service
        try:
            return call(service)
        except StoreError:
            raise
        except DISCONNECTED as exc:
            raise self.lost(exc, service) from exc

    def refusal(self) -> ManagerConnectionLostError | None:
        """The error of a call made while the manager is lost (None: it is not)."""
        gone, outage = self.gone, self.outage
        if gone is not None:
            return ManagerConnectionLostError(gone.address, gone.reason, gone.advice)
        if outage is None:
            return None
        if not self.reconnects:
            return outage.error(self.advice())
        return outage.error(
            f"this client reconnects by itself (unreachable for "
            f"{time.monotonic() - outage.since:.1f} s so far, tried every "
            f"{RECONNECT_MAX:g} s at most); nothing was sent: try again "
            f"once it has"
        )

    def lost(
        self, exc: BaseException, service: ServiceProxy, advice: str = ""
    ) -> ManagerConnectionLostError:
        """A call through ``service`` lost its connection: if that is the current proxy
        and the client is open, an outage starts (one that never ends for a client that
        does not reconnect: its calls are refused from now on, as its result thread
        closes it). Returns the caller's error, which ends with ``advice`` if the client
        reconnects."""
        outage = Outage(address=self.address, reason=describe(exc), since=time.monotonic())
        with self._lock:
            started = self.outage is None and service is self.service and not self.closed.is_set()
            if started:
                self.outage = outage
        if started and self._on_outage is not None:
            self._on_outage()
        return outage.error(
            self.advice(
                advice
                or "nothing more is known of what the call did; this client reconnects by itself"
            )
        )

    def close(self) -> None:
        """The client closed: it reconnects no more."""
        self.closed.set()

    def give_up(self, error: ManagerConnectionLostError) -> None:
        """The client closed on a lost manager: every later call raises ``error``."""
        self.gone = error

    def advice(self, reconnecting: str = "") -> str:
        """What a caller can do about a lost manager, as this client stands."""
        if self._connect is None:
            return self._lost_advice
        if self.closed.is_set():
            return "this client was closed, so it does not reconnect"
        return reconnecting

    def begin(self, reason: str) -> Outage:
        """The outage the result thread rides out (the one under way, or a new one)."""
        with self._lock:
            if self.outage is None:
                self.outage = Outage(address=self.address, reason=reason, since=time.monotonic())
            return self.outage

    def reconnect(self, watch: list[str], *, sender: str | None = None) -> Rejoin | None:
        """Connect with back-off until a manager answers, open this client there again
        and watch the jobs of ``watch``; None once the client is closed. ``sender``: the
        name of the outbox's thread, whose connection is opened here too (see
        ServiceProxy.open_connection: a stall during its handshake is one more try here,
        never a failed submit).

        Raises:
            AuthenticationError, VersionMismatchError: the manager there refused the client.
        """
        assert self._connect is not None
        backoff = RECONNECT_FIRST
        while not self.closed.wait(backoff):
            service: ServiceProxy | None = None
            try:
                service = self._connect()
                service.open_client(self.hello)
                durable = has_store(service)
                outcomes, unknown = (
                    service.watch_many(self.hello.client_id, watch) if watch else ([], [])
                )
                connection = None if sender is None else service.open_connection(sender)
                return Rejoin(
                    service=service,
                    durable=durable,
                    outcomes=outcomes,
                    unknown=unknown,
                    sender=connection,
                )
            # Not there yet, or gone again. AssertionError: Python < 3.12's handshake
            # asserts that the peer sent a challenge.
            except (*DISCONNECTED, AssertionError):
                if service is not None:
                    service.discard()
            except BaseException:
                if service is not None:
                    service.discard()
                raise
            backoff = min(backoff * 2, RECONNECT_MAX)
        return None

    def rejoined(self, rejoin: Rejoin) -> None:
        """Call the manager that took the client back from now on; the old proxy is
        discarded."""
        with self._lock:
            old, self.service = self.service, rejoin.service
            self.durable = rejoin.durable
        old.discard()

    def announce(self, outage: Outage, outstanding: int) -> None:
        """Say once that the client lost its manager and reconnects."""
        if not outstanding:
            jobs = "no job was outstanding"
        elif self.durable:
            jobs = (
                f"its {outstanding} outstanding job(s) stay in the manager's store and "
                f"resolve once it is back"
            )
        else:
            jobs = f"without a store, its {outstanding} outstanding job(s) failed"
        log.warning(
            "mpsched client %s: lost the connection to the manager at %s (%s); "
            "reconnecting (tried again after %g s, then twice as long each time, up "
            "to %g s); until then its calls raise ManagerConnectionLostError; %s",
            self.hello.client_id,
            self.address,
            outage.reason,
            RECONNECT_FIRST,
            RECONNECT_MAX,
            jobs,
        )

    def restored(self, outage: Outage, reattached: int, resent: int, unknown: int) -> None:
        """The outage is over: calls go through again; say so, and what came back."""
        with self._lock:
            self.outage = None
        log.info(
            "mpsched client %s: reconnected to the manager at %s after %.1f s: %d "
            "outstanding job(s) re-attached, %d sent again, %d unknown there (failed)",
            self.hello.client_id,
            self.address,
            time.monotonic() - outage.since,
            reattached,
            resent,
            unknown,
        )
