"""``python -m mpsched serve``: a manager in the foreground, its signals and its files.

``serve`` runs the manager and its local workers in this process. Without ``--address``
it is this user's local manager: it listens on ``manager.sock`` in the per-user runtime
directory (:mod:`mpsched._transport.runtime`), where every client command finds it with no flags,
and holds that directory's lock, so a second one exits 8 naming the first one's pid. A
serve given no key (no ``--authkey-file``, no $MPSCHED_AUTHKEY) uses this user's local
key from that directory, written by the first serve that needed it and reused after, on a
Unix socket or loopback TCP; it refuses a non-loopback address. The first SIGTERM or
SIGINT drains (no job is handed out any more, running jobs finish) and exits 0; a second
exits at once with 128 + the signal's number.

What it puts on disk is removed on every way out short of SIGKILL:

- its Unix socket (the default one or that of ``--address unix:PATH``);
- multiprocessing's temp directory (``pymp-*``, which holds the forkserver's socket).

On a normal exit multiprocessing's own finalizers unlink the socket (exit priority 0) and
remove ``pymp-*`` (priority -100). The second signal leaves through ``os._exit``, which
runs no finalizer, so it removes both first. The runtime directory stays, with the local
key and the lock file, for the next serve. A socket left by a serve killed with SIGKILL is
removed by the next serve at the same path: the default one's once the next default serve
holds the lock, another once nothing answers on it. The job store of ``--store`` (and its
``-wal``, ``-shm``, ``-leases``, ``-workers`` and ``.lock`` files) stays, on purpose: the
next serve on it gets its jobs back. One it cannot open (its directory missing or
read-only, a file that is not an mpsched store, another manager holding it) exits 7 with
one line naming the file.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import socket
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mpsched._cli.formats import plural
from mpsched._cli.options import tls_from_args
from mpsched._core.job import Order
from mpsched._core.options import Durability
from mpsched._errors import ConfigError, StoreError
from mpsched._manager.http.server import StatusAddressError
from mpsched._manager.main import run_manager
from mpsched._manager.service import ManagerService
from mpsched._protocol.records import (
    Exit,
    ManagerConfig,
    ManagerReady,
    StartMethod,
)
from mpsched._store.redis.server import check_store
from mpsched._store.redis.url import is_redis_url, shown_store
from mpsched._transport.address import Address, format_address, is_loopback, parse_address
from mpsched._transport.authkey import AUTHKEY_ENV, read_authkey
from mpsched._transport.http_access import LOOPBACK, HttpConfig, http_config, missing
from mpsched._transport.runtime import (
    SOCKET_NAME,
    default_address,
    ensure_local_authkey,
    lock_holder,
    open_runtime_dir,
    take_manager_lock,
)

log = logging.getLogger("mpsched.cli")


@dataclass
class ServeFiles:
    """What a serve process puts on disk and holds (see the module docstring)."""

    socket_path: str | None = None  # the Unix socket we listen on, if any
    lock_fd: int | None = None  # the runtime directory's lock, held until we exit

    def remove_now(self) -> None:
        """Do the exit finalizers' work, for a way out that runs none (``os._exit``)."""
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


@dataclass(frozen=True)
class ServeKey:
    """The manager's key and where clients find it."""

    key: bytes
    file: Path | None  # None: from $MPSCHED_AUTHKEY
    local: bool  # this user's local key, which clients of a local address read themselves


def run_serve(args: argparse.Namespace, out: TextIO) -> int:
    """The ``serve`` command; returns its exit code (7 when the store cannot be opened, 8
    when this user's local manager already runs).

    Raises:
        ConfigError: a bad Redis URL, or an ``--order`` other than that of the store's
            live managers.
        ExtraMissingError: a Redis URL without mpsched[redis].
        AddressError: ``--address`` does not parse.
        AuthenticationError: the key file is unreadable, empty or readable by others.
        RuntimeDirError: the runtime directory is another user's or open to others.
    """
    check_store(args.store or "", lease_timeout=args.lease_timeout)
    explicit = read_authkey(args.authkey_file)  # the file, else $MPSCHED_AUTHKEY
    address = None if args.address is None else parse_address(args.address)
    if args.http_token_file is not None and args.http is None:
        print("mpsched: --http-token-file goes with --http [HOST:]PORT", file=sys.stderr)
        return Exit.USAGE
    try:
        http = status_server(args)
    except ConfigError:
        _refuse_page(args)
        return Exit.UNSAFE
    if explicit is None and address is not None and not is_loopback(address):
        print(
            f"mpsched: refusing to serve on {format_address(address)} without an authkey: "
            f"anyone who can connect could run code here. Give --authkey-file (mode 0600) "
            f"or set {AUTHKEY_ENV}.",
            file=sys.stderr,
        )
        return Exit.UNSAFE
    key = _serve_key(args, explicit)
    files = ServeFiles()
    if address is None:
        address = _take_local_socket(files)
        if address is None:
            return Exit.RUNNING
    if isinstance(address, str):
        problem = claim_socket_path(address)
        if problem:
            print(
                f"mpsched: cannot listen on {format_address(address)}: {problem}", file=sys.stderr
            )
            return Exit.USAGE
        files.socket_path = address
    # Until the manager is up there is nothing to drain: SIGTERM unwinds like Ctrl-C,
    # through the manager's clean-up, and the exit finalizers remove the files.
    signal.signal(signal.SIGTERM, _exit_before_ready)
    return _run_served(args, out, key, address, files, http)


def _refuse_page(args: argparse.Namespace) -> None:
    """Say on stderr why ``--http`` on a non-loopback address is refused: what it lacks."""
    tls = tls_from_args(args)
    lacking = missing(token=args.http_token_file, tls=tls and tls.cert)
    print(
        f"mpsched: refusing to serve the status page on {args.http} without "
        f"{lacking}: anyone who can connect to it could read the scheduler's jobs. "
        f"Give {'both' if ' and ' in lacking else 'it'}, or a loopback address "
        f"(--http PORT serves {LOOPBACK}:PORT).",
        file=sys.stderr,
    )


def _serve_key(args: argparse.Namespace, explicit: bytes | None) -> ServeKey:
    """The key given (``explicit``: the file's, else $MPSCHED_AUTHKEY's), else this
    user's local key, written at the first serve that needs it.

    Raises:
        RuntimeDirError: the runtime directory is another user's or open to others.
    """
    if explicit is None:
        local_key, local_file = ensure_local_authkey()
        return ServeKey(key=local_key, file=local_file, local=True)
    return ServeKey(key=explicit, file=args.authkey_file, local=False)


def status_server(args: argparse.Namespace) -> HttpConfig | None:
    """What ``--http`` and ``--http-token-file`` ask for (None: no status server).

    Raises:
        AddressError, AuthenticationError, ConfigError: as ``http_config``.
    """
    if args.http is None:
        return None
    return http_config(args.http, args.http_token_file, tls_from_args(args))


def _take_local_socket(files: ServeFiles) -> str | None:
    """The local manager's socket, once this process holds the runtime directory's lock
    (kept in ``files`` until it exits); None, said on stderr, if another process holds it.
    """
    directory = open_runtime_dir(create=True)
    assert directory is not None  # made, or it raised
    files.lock_fd = take_manager_lock(directory)
    if files.lock_fd is None:
        holder = lock_holder(directory)
        print(
            f"mpsched: this user's local manager is already running "
            f"({f'pid {holder}' if holder else 'its pid is not written yet'}) on "
            f"{format_address(default_address())}; python -m mpsched status shows it. "
            f"Stop it first, or serve another with --address.",
            file=sys.stderr,
        )
        return None
    return str(directory / SOCKET_NAME)


def claim_socket_path(path: str) -> str:
    """Make ``path`` free for a new Unix socket; return why it is not, or "".

    A socket file that refuses connections was left by a serve that could not clean up
    (SIGKILL): it is removed. One that accepts them belongs to a live process, and
    anything that is not a socket is not ours to remove.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return str(exc)
    if not stat.S_ISSOCK(mode):
        return "the path exists and is not a socket"
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
            log.info("removed the stale socket %s (nothing listened on it)", path)
            return ""
        except OSError as exc:
            return str(exc)
    return "another process is listening there (a running mpsched serve?)"


def _exit_before_ready(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _run_served(
    args: argparse.Namespace,
    out: TextIO,
    key: ServeKey,
    address: Address,
    files: ServeFiles,
    http: HttpConfig | None,
) -> int:
    """Run the manager until it stops; print its banner once it listens."""
    config = manager_config(args, key.key, address, http)
    listening = False

    def ready(message: ManagerReady, service: ManagerService) -> None:
        nonlocal listening
        listening = True
        _install_stop_handlers(service, files)
        where = format_address(message.address)
        flags = client_flags(where, key, default=args.address is None)
        print(
            f"mpsched manager listening on {where} (pid {message.pid}, "
            f"{plural(args.workers, 'local worker')}, key {key.file or '$' + AUTHKEY_ENV})\n"
            f"  join:   python -m mpsched worker{flags}\n"
            f"  status: python -m mpsched status{flags}\n"
            f"  store:  {describe_store(config)}",
            *([f"  page:   {describe_page(message.http_url, http)}"] if http else []),
            *(f"  {line}" for line in message.recovered),
            sep="\n",
            file=out,
            flush=True,
        )

    try:
        return run_manager(config, on_ready=ready)
    except StoreError as exc:  # before an OSError: it is one, but not the listener's
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.STORE
    except StatusAddressError as exc:  # an OSError too, but not the manager's listener's
        print(f"mpsched: {exc.strerror}", file=sys.stderr)
        return Exit.USAGE
    except OSError as exc:
        if listening:
            raise
        print(f"mpsched: cannot listen on {format_address(address)}: {exc}", file=sys.stderr)
        return Exit.USAGE


def manager_config(
    args: argparse.Namespace, authkey: bytes, address: Address, http: HttpConfig | None
) -> ManagerConfig:
    """The manager serve's options ask for, listening at ``address`` with ``authkey``."""
    return ManagerConfig(
        authkey=authkey,
        workers=args.workers,
        mp_method=StartMethod.default(),
        address=address,
        order=Order(args.order),
        max_pending=args.max_pending,
        max_pending_bytes=args.max_pending_bytes,
        log_level=logging.getLogger().getEffectiveLevel(),
        heartbeat_timeout=args.heartbeat_timeout,
        drain_timeout=args.drain_timeout,
        tls=tls_from_args(args),
        store=store_path(args.store),
        durability=Durability.coerce(args.durability),
        result_ttl=args.result_ttl,
        http=http,
        lease_timeout=args.lease_timeout,
        drain_workers_on_stop=args.drain_workers_on_stop,
        queues=args.queues,
        limits=tuple(args.limit),
    )


def client_flags(where: str, key: ServeKey, *, default: bool) -> str:
    """What a client command on this machine must add to reach this manager: nothing for
    the local manager with the local key; else ``--connect``, and where the key is."""
    flags = "" if default else f" --connect {where}"
    if key.file is None:
        return f"{flags} (key in ${AUTHKEY_ENV})"
    return flags if key.local else f"{flags} --authkey-file {key.file}"


def describe_page(url: str, http: HttpConfig) -> str:
    """The ``page:`` line of serve's banner: where, and what a visitor may do."""
    if http.token is None:
        return f"{url} (metrics at {url}metrics; read-only: --http-token-file allows actions)"
    return (
        f"{url}#token=TOKEN (metrics at {url}metrics; every request needs the token in "
        f"--http-token-file)"
    )


def store_path(option: str | None) -> str | None:
    """The store ``--store`` names: a Redis URL as it is, a file as an absolute path;
    None for none (or "")."""
    if not option:
        return None
    return option if is_redis_url(option) else os.path.realpath(option)


def describe_store(config: ManagerConfig) -> str:
    """The ``store:`` line of serve's banner."""
    if config.store is None:
        return (
            f"memory: jobs end with this manager (--store FILE keeps them); outcomes "
            f"kept {config.result_ttl:g} s, at most 100,000"
        )
    if is_redis_url(config.store):
        return (
            f"{shown_store(config.store)} (shared by every manager on it; presumed "
            f"dead after {config.lease_timeout:g} s without a heartbeat; outcomes kept "
            f"{config.result_ttl:g} s)"
        )
    return f"{config.store} (durability {config.durability}, outcomes kept {config.result_ttl:g} s)"


def _install_stop_handlers(service: ManagerService, files: ServeFiles) -> None:
    """First SIGTERM/SIGINT: stop handing out jobs and drain. Second: exit now."""
    stops = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stops
        stops += 1
        if stops > 1:
            files.remove_now()
            os._exit(128 + signum)  # the workers follow: their lifeline pipe closes
        log.warning("received %s: draining", signal.Signals(signum).name)
        threading.Thread(target=service.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
