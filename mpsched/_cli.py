"""``python -m mpsched``: serve, worker, submit, status, demo, stress.

``main(argv)`` returns an exit code (see :class:`mpsched._protocol.Exit`), so tests call
it directly. The grammar and help texts live in :mod:`mpsched._cli_parser`, ``serve`` in
:mod:`mpsched._serve`, ``demo`` and ``stress`` in their own modules; this one runs the
client commands and turns errors into one line and an exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

from mpsched._cli_parser import build_parser, tls_from_args
from mpsched._client import connect
from mpsched._errors import (
    AuthenticationError,
    InvalidJobError,
    ManagerUnreachableError,
    MpschedError,
    SchedulerShutdownError,
    VersionMismatchError,
)
from mpsched._futures import JobFuture
from mpsched._protocol import ClientHello, ServiceProxy, Stats, connect_service
from mpsched._protocol import Exit as Exit  # the codes main() returns, for its callers
from mpsched._serve import default_method, run_serve
from mpsched._tls import set_tls
from mpsched._transport import (
    AUTHKEY_ENV,
    Address,
    AddressError,
    describe_versions,
    format_address,
    parse_address,
    read_authkey,
    scrub_authkey_env,
)
from mpsched._worker import WorkerConfig

log = logging.getLogger("mpsched.cli")


class UsageError(MpschedError, ValueError):
    """A command line that names something that does not exist or does not parse."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return Exit.USAGE
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    handler = HANDLERS[args.command]
    try:
        tls = tls_from_args(args)
        if tls is not None and args.command != "serve":  # serve hands it to its manager
            set_tls(tls)
        return handler(args, sys.stdout)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second traceback while we leave
        print("mpsched: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except (AddressError, UsageError, InvalidJobError) as exc:
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.USAGE
    except AuthenticationError as exc:
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.AUTH
    except VersionMismatchError as exc:
        print(f"mpsched: refused: {exc}", file=sys.stderr)
        return Exit.VERSION
    except ManagerUnreachableError as exc:
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except (SchedulerShutdownError, ConnectionError, FileNotFoundError, EOFError) as exc:
        print(f"mpsched: no manager answers at {getattr(args, 'connect', '?')}: {exc}",
              file=sys.stderr)
        return Exit.UNREACHABLE


# ------------------------------------------------------------------------------ worker


def _worker(args: argparse.Namespace, out: TextIO) -> int:
    address = parse_address(args.connect)
    key = _require_key(args)
    # Fail fast, in this process, on a wrong address, key or version.
    _probe(address, key)
    from mpsched._remote import WorkerPool

    scrub_authkey_env()  # read: the workers and their jobs must not inherit it
    config = WorkerConfig(address=address, authkey=key, worker_id="",
                          log_level=logging.getLogger().getEffectiveLevel(),
                          heartbeat_interval=args.heartbeat_interval,
                          tls=tls_from_args(args))
    pool = WorkerPool(config, args.processes, default_method())
    print(f"mpsched worker: {args.processes} processes joined {format_address(address)}",
          file=out, flush=True)
    return pool.run()


def _require_key(args: argparse.Namespace) -> bytes:
    key = read_authkey(args.authkey_file)
    if key is None:
        raise AuthenticationError(
            f"no authkey: give --authkey-file (mode 0600) or set {AUTHKEY_ENV}")
    return key


def _connect_service(address: Address, key: bytes) -> ServiceProxy:
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


def _probe(address: Address, key: bytes) -> None:
    """Connect and say hello as a client: raises what a worker or producer would meet."""
    service = _connect_service(address, key)
    python, cp = describe_versions()
    service.open_client(ClientHello(f"probe-{os.getpid()}", python, cp))
    service.close_client(f"probe-{os.getpid()}")


# ------------------------------------------------------------------------------ submit


def _submit(args: argparse.Namespace, out: TextIO) -> int:
    fn = _import_target(args.target)
    call_args = _json_option("--args", args.args)
    call_kwargs = _json_option("--kwargs", args.kwargs)
    if not isinstance(call_args, list) or not isinstance(call_kwargs, dict):
        raise UsageError("--args must be a JSON list and --kwargs a JSON object")
    try:
        at = datetime.fromisoformat(args.at) if args.at else None
    except ValueError:
        raise UsageError(f"--at {args.at!r} is not an ISO 8601 time") from None
    client = connect(parse_address(args.connect), authkey=_require_key(args))
    interrupted = False
    try:
        future = client.schedule(fn, *call_args, delay=args.delay, at=at,
                                 priority=args.priority, timeout=args.timeout,
                                 retries=args.retries, **call_kwargs)
        try:
            print(future.job_id, file=out, flush=True)
            return _print_result(future, out) if args.wait else Exit.OK
        except KeyboardInterrupt:
            interrupted = True
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # no traceback while we detach
            print(f"mpsched: interrupted; job {future.job_id} stays queued: it will run, "
                  f"and its result is discarded (mpsched has no cancel command)",
                  file=sys.stderr)
            return Exit.INTERRUPTED
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if args.wait and not interrupted:
            client.shutdown()
        else:  # without waiting; a job not sent yet is sent before detach() returns
            client.detach()


def _print_result(future: JobFuture[Any], out: TextIO) -> int:
    """Wait for the job; print its result as JSON, or say why it failed."""
    try:
        result = future.result()
    except Exception as exc:
        print(f"job {future.job_id} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return Exit.FAILURE
    print(_as_json(result), file=out)
    return Exit.OK


def _import_target(target: str) -> Callable[..., Any]:
    module_name, sep, name = target.partition(":")
    if not sep or not module_name or not name:
        raise UsageError(f"target {target!r} must be module:function")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot import {target}: {exc}") from None
    if not callable(obj):
        raise UsageError(f"{target} is not callable")
    return obj  # type: ignore[no-any-return]


def _json_option(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} is not JSON: {exc}") from None


def _as_json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# ------------------------------------------------------------------------------ status


def _status(args: argparse.Namespace, out: TextIO) -> int:
    address = parse_address(args.connect)
    stats = _connect_service(address, _require_key(args)).stats()
    if args.json:
        json.dump(dataclasses.asdict(stats), out, indent=2)
        out.write("\n")
    else:
        out.write(format_stats(stats, format_address(address), time.time()))
    return Exit.OK


def format_stats(stats: Stats, where: str, now: float) -> str:
    """The text ``status`` prints; ``now`` (epoch seconds) dates the next due job."""
    q = stats.queue
    ms = {k: f"{v * 1000:.1f} ms" for k, v in q.lateness.items()}
    lines = [
        f"manager {where}, up {format_duration(stats.uptime)}",
        f"pending   high {q.pending['high']}  medium {q.pending['medium']}  "
        f"low {q.pending['low']}   in flight {q.in_flight}   "
        f"next job {format_due(q.next_due_in, now)}",
        f"done      completed {q.completed}  failed {q.failed}  cancelled {q.cancelled}  "
        f"retried {q.retried}  timed out {q.timed_out}   {stats.throughput:.1f} jobs/s",
        f"lateness  p50 {ms['p50']}  p90 {ms['p90']}  p99 {ms['p99']}  max {ms['max']}  "
        f"({q.lateness_samples} jobs)",
        f"workers   {len(stats.workers)}",
        f"  {'id':<14} {'host':<16} {'pid':>7} {'cpu%':>6} {'rss MB':>7} {'done':>6}  current",
    ]
    for w in stats.workers:
        lines.append(f"  {w.worker_id:<14} {w.host:<16} {w.pid:>7} {w.cpu_percent:>6.1f} "
                     f"{w.rss / 2**20:>7.1f} {w.jobs_done:>6}  {w.current_job or '-'}")
    return "\n".join(lines) + "\n"


def format_due(due_in: float | None, now: float) -> str:
    """``due in 3 h 02 min (2026-12-03T09:28:11+01:00)`` or ``overdue by 1.2 s (...)``:
    the wait, then the local wall-clock time; "-" for no job."""
    if due_in is None:
        return "-"
    wait = f"due in {format_duration(due_in)}" if due_in >= 0 else \
        f"overdue by {format_duration(-due_in)}"
    try:
        when = datetime.fromtimestamp(now + due_in).astimezone()
    except (OverflowError, OSError, ValueError):  # past the year 9999: no date to show
        return wait
    return f"{wait} ({when.isoformat(timespec='seconds')})"


def format_duration(seconds: float) -> str:
    """``350 ms``, ``1.2 s``, ``4 min 05 s``, ``3 h 02 min``, ``12 d 04 h``; capped at a
    century, so that no time prints as a 300-digit number."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds >= 100 * 365.25 * 86400:
        return "more than 100 years"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


# ------------------------------------------------------------------------------ demo, stress


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._demo import run_demo

    return run_demo(out)


def _stress(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._stress import run_stress

    address = parse_address(args.connect) if args.connect else None
    key = None
    if address is not None:
        key = _require_key(args)
        _probe(address, key)  # before any producer starts: a wrong address fails once
    return run_stress(producers=args.producers, workers=args.workers, jobs=args.jobs,
                      horizon=args.horizon, address=address, authkey=key,
                      inject=args.inject, out=out)


Handler = Callable[[argparse.Namespace, TextIO], int]
HANDLERS: dict[str, Handler] = {"serve": run_serve, "worker": _worker, "submit": _submit,
                                "status": _status, "demo": _demo, "stress": _stress}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

