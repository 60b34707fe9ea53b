"""``python -m mpsched``: serve, worker, submit, status, demo, stress.

``main(argv)`` returns an exit code (see :class:`mpsched._protocol.Exit`), so tests call
it directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from mpsched._errors import (
    AuthenticationError,
    InvalidJobError,
    MpschedError,
    SchedulerShutdownError,
    VersionMismatchError,
)
from mpsched._job import Order
from mpsched._manager import run_manager
from mpsched._protocol import (
    HEARTBEAT_TIMEOUT,
    ClientHello,
    Exit,
    ManagerConfig,
    ManagerReady,
    Stats,
    connect_service,
)
from mpsched._service import ManagerService
from mpsched._transport import (
    AUTHKEY_ENV,
    Address,
    AddressError,
    describe_versions,
    format_address,
    is_loopback,
    parse_address,
    private_runtime_dir,
    read_authkey,
    write_authkey,
)
from mpsched._worker import WorkerConfig

log = logging.getLogger("mpsched.cli")


class UsageError(MpschedError, ValueError):
    """A command line that names something that does not exist or does not parse."""


EPILOG_KEY = (f"The authkey comes from --authkey-file (mode 0600) or ${AUTHKEY_ENV}; never "
              f"from the command line.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return Exit.USAGE
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    handler: Callable[[argparse.Namespace, TextIO], int] = args.handler
    try:
        return handler(args, sys.stdout)
    except (AddressError, UsageError, InvalidJobError) as exc:
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.USAGE
    except AuthenticationError as exc:
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.AUTH
    except VersionMismatchError as exc:
        print(f"mpsched: refused: {exc}", file=sys.stderr)
        return Exit.VERSION
    except (SchedulerShutdownError, ConnectionError, FileNotFoundError, EOFError) as exc:
        print(f"mpsched: no manager answers at {getattr(args, 'connect', '?')}: {exc}",
              file=sys.stderr)
        return Exit.UNREACHABLE


# ------------------------------------------------------------------------------ parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpsched",
        description="Run Python jobs at a scheduled time, in priority order, on worker "
                    "processes.")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, handler: Callable[..., int], help: str,
                example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help,
                           epilog=f"example:\n  {example}\n\n{EPILOG_KEY}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(command=name, handler=handler)
        p.add_argument("--log-level", default="warning",
                       choices=["debug", "info", "warning", "error"])
        return p

    serve = command("serve", _serve, "run a manager with local workers",
                    "python -m mpsched serve --address 127.0.0.1:7000 --workers 4")
    serve.add_argument("--address", help="unix:PATH or HOST:PORT (default: a Unix socket "
                                         "in a private runtime directory)")
    serve.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="local worker processes (default: the number of cores; 0 for "
                            "remote workers only)")
    serve.add_argument("--authkey-file", type=Path)
    serve.add_argument("--order", choices=[o.value for o in Order], default="time")
    serve.add_argument("--max-pending", type=_count)
    serve.add_argument("--heartbeat-timeout", type=_seconds, default=HEARTBEAT_TIMEOUT,
                       help="seconds of silence after which a remote worker is declared gone")
    serve.add_argument("--drain-timeout", type=float, default=30.0,
                       help="on SIGTERM, how long running jobs may take to finish")

    worker = command("worker", _worker, "join a running manager with worker processes",
                     "python -m mpsched worker --connect 10.0.0.5:7000 --authkey-file key")
    worker.add_argument("--connect", required=True, help="the manager's address")
    worker.add_argument("--processes", type=_count, default=os.cpu_count() or 1)
    worker.add_argument("--authkey-file", type=Path)
    worker.add_argument("--heartbeat-interval", type=_seconds, default=2.0)

    submit = command("submit", _submit, "submit an importable callable",
                     "python -m mpsched submit math:factorial --args '[20]' --delay 5 "
                     "--connect unix:/run/mpsched.sock --wait")
    submit.add_argument("target", help="module:function")
    submit.add_argument("--connect", required=True)
    submit.add_argument("--authkey-file", type=Path)
    submit.add_argument("--args", default="[]", help="JSON list of positional arguments")
    submit.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="seconds from now")
    when.add_argument("--at", help="ISO 8601 time (naive means local time)")
    submit.add_argument("--priority", choices=["high", "medium", "low"], default="medium")
    submit.add_argument("--timeout", type=float)
    submit.add_argument("--retries", type=int, default=0)
    submit.add_argument("--wait", action="store_true", help="wait and print the result")

    status = command("status", _status, "show queue, workers and lateness",
                     "python -m mpsched status --connect unix:/run/mpsched.sock --json")
    status.add_argument("--connect", required=True)
    status.add_argument("--authkey-file", type=Path)
    status.add_argument("--json", action="store_true")

    command("demo", _demo, "the seed demo: three waves of prioritised jobs on 3 workers",
            "python -m mpsched demo")

    stress = command("stress", _stress, "flood a manager and verify exactly-once, none early",
                     "python -m mpsched stress --producers 3 --workers 4 --jobs 5000")
    stress.add_argument("--producers", type=_count, default=3)
    stress.add_argument("--workers", type=_count, default=2)
    stress.add_argument("--jobs", type=_count, default=3000)
    stress.add_argument("--horizon", type=_seconds_or_zero, default=2.0,
                        help="due times are random in [0, horizon] seconds")
    stress.add_argument("--connect", help="use a running manager instead of starting one")
    stress.add_argument("--authkey-file", type=Path)
    stress.add_argument("--inject", choices=["duplicate", "loss"],
                        help=argparse.SUPPRESS)  # proves the verifier catches faults
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _seconds(text: str) -> float:
    value = _seconds_or_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {text}")
    return value


# ------------------------------------------------------------------------------ serve


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    if args.workers < 0:
        raise UsageError("--workers must be 0 or more")
    key = read_authkey(args.authkey_file)
    runtime: Path | None = None
    if args.address is None:
        runtime = private_runtime_dir()
        address: Address = str(runtime / "manager.sock")
    else:
        address = parse_address(args.address)
    if key is None and not is_loopback(address):
        print(f"mpsched: refusing to serve on {format_address(address)} without an authkey: "
              f"anyone who can connect could run code here. Give --authkey-file (mode 0600) "
              f"or set {AUTHKEY_ENV}.", file=sys.stderr)
        return Exit.UNSAFE
    key_file = args.authkey_file
    if key is None:
        runtime = runtime or private_runtime_dir()
        key_file = runtime / "authkey"
        key = write_authkey(key_file)
    try:
        return _run_served(args, out, key, key_file, address)
    finally:
        if runtime is not None:  # ours alone: the socket and the generated key
            shutil.rmtree(runtime, ignore_errors=True)


def _run_served(args: argparse.Namespace, out: TextIO, key: bytes, key_file: Path | None,
                address: Address) -> int:
    config = ManagerConfig(
        authkey=key, workers=args.workers, mp_method=_default_method(), address=address,
        order=Order(args.order), max_pending=args.max_pending,
        log_level=logging.getLogger().getEffectiveLevel(),
        heartbeat_timeout=args.heartbeat_timeout, drain_timeout=args.drain_timeout)

    listening = False

    def ready(message: ManagerReady, service: ManagerService) -> None:
        nonlocal listening
        listening = True
        _install_stop_handlers(service)
        where = format_address(message.address)
        key_hint = f"--authkey-file {key_file}" if key_file else f"(key in ${AUTHKEY_ENV})"
        print(f"mpsched manager listening on {where} (pid {message.pid}, "
              f"{args.workers} local workers)\n"
              f"  join:   python -m mpsched worker --connect {where} {key_hint}\n"
              f"  status: python -m mpsched status --connect {where} {key_hint}",
              file=out, flush=True)

    try:
        return run_manager(config, on_ready=ready)
    except OSError as exc:
        if listening:
            raise
        print(f"mpsched: cannot listen on {format_address(address)}: {exc}", file=sys.stderr)
        return Exit.USAGE


def _install_stop_handlers(service: ManagerService) -> None:
    """First SIGTERM/SIGINT: stop handing out jobs and drain. Second: exit now."""
    stops = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stops
        stops += 1
        if stops > 1:
            os._exit(128 + signum)
        log.warning("received %s: draining", signal.Signals(signum).name)
        threading.Thread(target=service.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _default_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


# ------------------------------------------------------------------------------ worker


def _worker(args: argparse.Namespace, out: TextIO) -> int:
    address = parse_address(args.connect)
    key = _require_key(args)
    # Fail fast, in this process, on a wrong address, key or version.
    _probe(address, key)
    from mpsched._remote import WorkerPool

    config = WorkerConfig(address=address, authkey=key, worker_id="",
                          log_level=logging.getLogger().getEffectiveLevel(),
                          heartbeat_interval=args.heartbeat_interval)
    pool = WorkerPool(config, args.processes, _default_method())
    print(f"mpsched worker: {args.processes} processes joined {format_address(address)}",
          file=out, flush=True)
    return pool.run()


def _require_key(args: argparse.Namespace) -> bytes:
    key = read_authkey(args.authkey_file)
    if key is None:
        raise AuthenticationError(
            f"no authkey: give --authkey-file (mode 0600) or set {AUTHKEY_ENV}")
    return key


def _probe(address: Address, key: bytes) -> None:
    service = connect_service(address, key)
    python, cp = describe_versions()
    service.open_client(ClientHello(f"probe-{os.getpid()}", python, cp))
    service.close_client(f"probe-{os.getpid()}")


# ------------------------------------------------------------------------------ submit


def _submit(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._client import connect

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
    try:
        future = client.schedule(fn, *call_args, delay=args.delay, at=at,
                                 priority=args.priority, timeout=args.timeout,
                                 retries=args.retries, **call_kwargs)
        print(future.job_id, file=out, flush=True)
        if not args.wait:
            return Exit.OK
        try:
            result = future.result()
        except Exception as exc:
            print(f"job {future.job_id} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return Exit.FAILURE
        print(_as_json(result), file=out)
        return Exit.OK
    finally:
        if args.wait:
            client.shutdown()
        else:
            client.detach()


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
    stats = connect_service(address, _require_key(args)).stats()
    if args.json:
        json.dump(dataclasses.asdict(stats), out, indent=2)
        out.write("\n")
    else:
        out.write(format_stats(stats, format_address(address)))
    return Exit.OK


def format_stats(stats: Stats, where: str) -> str:
    q = stats.queue
    ms = {k: f"{v * 1000:.1f} ms" for k, v in q.lateness.items()}
    next_due = "-" if q.next_due_in is None else f"{q.next_due_in:.2f} s"
    lines = [
        f"manager {where}, up {stats.uptime:.1f} s",
        f"pending   high {q.pending['high']}  medium {q.pending['medium']}  "
        f"low {q.pending['low']}   in flight {q.in_flight}   next due in {next_due}",
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


# ------------------------------------------------------------------------------ demo, stress


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._demo import run_demo

    return run_demo(out)


def _stress(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._stress import run_stress

    address = parse_address(args.connect) if args.connect else None
    key = _require_key(args) if address is not None else None
    return run_stress(producers=args.producers, workers=args.workers, jobs=args.jobs,
                      horizon=args.horizon, address=address, authkey=key,
                      inject=args.inject, out=out)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

