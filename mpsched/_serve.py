"""``python -m mpsched serve``: a manager in the foreground, its signals and its files.

``serve`` runs the manager and its local workers in this process. It listens on the
address given, or on a Unix socket in a fresh private directory with a generated key
beside it. The first SIGTERM or SIGINT drains (no job is handed out any more, running jobs
finish) and exits 0; a second exits at once with 128 + the signal's number.

What it puts on disk is removed on every way out short of SIGKILL:

- its private runtime directory (``mpsched-*``: the socket and the generated key);
- the Unix socket of ``--address unix:PATH``;
- multiprocessing's temp directory (``pymp-*``, which holds the forkserver's socket).

On a normal exit multiprocessing's own finalizers unlink the socket (exit priority 0) and
remove ``pymp-*`` (priority -100); the runtime directory goes between the two (-1), after
its socket, so that no finalizer finds its file gone and prints a traceback. The second
signal leaves through ``os._exit``, which runs no finalizer, so it removes all three first.
A socket file left by a serve killed with SIGKILL is removed by the next serve at the same
path once nothing answers on it. The job store of ``--store`` (and its ``-wal``, ``-shm``,
``-leases`` and ``.lock`` files) stays, on purpose: the next serve on it gets its jobs
back. One it cannot open (its directory missing or read-only, a file that is not an mpsched
store, another manager holding it) exits 7 with one line naming the file.
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

from mpsched._cli_parser import plural, tls_from_args
from mpsched._errors import StoreError
from mpsched._job import Order
from mpsched._manager import run_manager
from mpsched._protocol import Exit, ManagerConfig, ManagerReady
from mpsched._service import ManagerService
from mpsched._transport import (
    AUTHKEY_ENV,
    Address,
    format_address,
    is_loopback,
    parse_address,
    private_runtime_dir,
    read_authkey,
    write_authkey,
)

log = logging.getLogger("mpsched.cli")


@dataclass
class ServeFiles:
    """What a serve process puts on disk (see the module docstring)."""

    runtime: Path | None = None  # our private directory, if we made one
    socket_path: str | None = None  # the Unix socket we listen on, if any

    def make_runtime(self) -> Path:
        """Create the private runtime directory once; it is removed at exit."""
        if self.runtime is None:
            self.runtime = private_runtime_dir()
            # After the listener's unlink of its socket (0), before pymp-* goes (-100).
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(str(self.runtime),),
                                          kwargs={"ignore_errors": True}, exitpriority=-1)
        return self.runtime

    def remove_now(self) -> None:
        """Do the exit finalizers' work, for a way out that runs none (``os._exit``)."""
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
        if self.runtime is not None:
            shutil.rmtree(self.runtime, ignore_errors=True)
        shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


def run_serve(args: argparse.Namespace, out: TextIO) -> int:
    """The ``serve`` command; returns its exit code (7 when the store cannot be opened).

    Raises:
        AddressError: ``--address`` does not parse.
        AuthenticationError: the key file is unreadable, empty or readable by others.
    """
    key = read_authkey(args.authkey_file)
    files = ServeFiles()
    if args.address is None:
        address: Address = str(files.make_runtime() / "manager.sock")
    else:
        address = parse_address(args.address)
    if key is None and not is_loopback(address):
        print(f"mpsched: refusing to serve on {format_address(address)} without an authkey: "
              f"anyone who can connect could run code here. Give --authkey-file (mode 0600) "
              f"or set {AUTHKEY_ENV}.", file=sys.stderr)
        return Exit.UNSAFE
    if isinstance(address, str):
        problem = claim_socket_path(address)
        if problem:
            print(f"mpsched: cannot listen on {format_address(address)}: {problem}",
                  file=sys.stderr)
            return Exit.USAGE
        files.socket_path = address
    key_file = args.authkey_file
    if key is None:
        key_file = files.make_runtime() / "authkey"
        key = write_authkey(key_file)
    # Until the manager is up there is nothing to drain: SIGTERM unwinds like Ctrl-C,
    # through the manager's clean-up, and the exit finalizers remove the files.
    signal.signal(signal.SIGTERM, _exit_before_ready)
    return _run_served(args, out, key, key_file, address, files)


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


def _run_served(args: argparse.Namespace, out: TextIO, key: bytes, key_file: Path | None,
                address: Address, files: ServeFiles) -> int:
    config = ManagerConfig(
        authkey=key, workers=args.workers, mp_method=default_method(), address=address,
        order=Order(args.order), max_pending=args.max_pending,
        max_pending_bytes=args.max_pending_bytes,
        log_level=logging.getLogger().getEffectiveLevel(),
        heartbeat_timeout=args.heartbeat_timeout, drain_timeout=args.drain_timeout,
        tls=tls_from_args(args), store=store_path(args.store),
        durability=args.durability, result_ttl=args.result_ttl)

    listening = False

    def ready(message: ManagerReady, service: ManagerService) -> None:
        nonlocal listening
        listening = True
        _install_stop_handlers(service, files)
        where = format_address(message.address)
        key_hint = f"--authkey-file {key_file}" if key_file else f"(key in ${AUTHKEY_ENV})"
        print(f"mpsched manager listening on {where} (pid {message.pid}, "
              f"{plural(args.workers, 'local worker')})\n"
              f"  join:   python -m mpsched worker --connect {where} {key_hint}\n"
              f"  status: python -m mpsched status --connect {where} {key_hint}\n"
              f"  store:  {describe_store(config)}",
              *(f"  {line}" for line in message.recovered), sep="\n", file=out, flush=True)

    try:
        return run_manager(config, on_ready=ready)
    except StoreError as exc:  # before an OSError: it is one, but not the listener's
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.STORE
    except OSError as exc:
        if listening:
            raise
        print(f"mpsched: cannot listen on {format_address(address)}: {exc}", file=sys.stderr)
        return Exit.USAGE


def store_path(option: str | None) -> str | None:
    """The store file ``--store`` names, as an absolute path; None for none (or "")."""
    return os.path.realpath(option) if option else None


def describe_store(config: ManagerConfig) -> str:
    """The ``store:`` line of serve's banner."""
    if config.store is None:
        return "memory: jobs end with this manager (--store FILE keeps them)"
    return (f"{config.store} (durability {config.durability}, outcomes kept "
            f"{config.result_ttl:g} s)")


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


def default_method() -> str:
    """The start method for worker processes: forkserver where there is one, else spawn."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
