"""``python -m mpsched``: serve, worker, drain-workers, submit, status, jobs, cancel,
result, demo, stress.

``main(argv)`` returns an exit code (see :class:`mpsched._protocol.records.Exit`), so tests call
it directly. The grammar and help texts live in :mod:`mpsched._cli.parser`, ``serve`` in
:mod:`mpsched._cli.serve`, ``drain-workers`` in :mod:`mpsched._cli.drain`, the commands
that read and change jobs (status, jobs, cancel, result) in :mod:`mpsched._cli.jobs`,
``demo`` and ``stress`` in their own modules; this one runs ``worker`` and ``submit`` and
turns errors into one line and an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, TextIO

import cloudpickle

from mpsched._cli.connection import manager_of, service_at
from mpsched._cli.drain import run_drain_workers
from mpsched._cli.formats import plural
from mpsched._cli.jobs import print_outcome, run_cancel, run_jobs, run_requeue, run_result
from mpsched._cli.options import tls_from_args
from mpsched._cli.parser import Command, build_parser, usage_line
from mpsched._cli.schedules import check_recurring, run_schedules, submit_recurring
from mpsched._cli.serve import run_serve
from mpsched._cli.status import run_status
from mpsched._client.client import Client, connect
from mpsched._core.retrying import RetryPolicy, coerce_retry
from mpsched._errors import (
    AddressError,
    AuthenticationError,
    ConfigError,
    ExtraMissingError,
    InvalidJobError,
    ManagerBusyError,
    ManagerUnreachableError,
    MpschedError,
    SchedulerShutdownError,
    StoreError,
    VersionMismatchError,
)
from mpsched._protocol.records import (
    ClientHello,
    Exit,
    StartMethod,
)
from mpsched._store.redis.server import check_store
from mpsched._store.redis.url import is_redis_url
from mpsched._transport.address import Address, format_address
from mpsched._transport.authkey import scrub_authkey_env
from mpsched._transport.runtime import default_address
from mpsched._transport.sockets import describe_versions
from mpsched._transport.tls import set_tls
from mpsched._worker.process import WorkerConfig

log = logging.getLogger("mpsched.cli")

# Seconds ``worker`` waits between tries of a busy manager (each try is itself tried again
# for CONNECT_TIMEOUT: mpsched._transport.connect).
BUSY_PAUSE = 1.0


class UsageError(MpschedError, ValueError):
    """A command line that names something that does not exist or does not parse."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_command_line(argv)
    if args.command is None:
        parser.print_help()
        return Exit.USAGE
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    handler = HANDLERS[args.command]
    try:
        tls = tls_from_args(args)
        if tls is not None and args.command != Command.SERVE:  # serve hands it to its manager
            set_tls(tls)
        return handler(args, sys.stdout)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second traceback while we leave
        print("mpsched: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except (AddressError, UsageError, InvalidJobError, ConfigError) as exc:
        print(usage_line(str(exc), args.command), file=sys.stderr)
        return Exit.USAGE
    except ExtraMissingError as exc:  # it names the process that lacks it
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
    except StoreError as exc:  # an OSError, but no connection's: said as it is
        print(f"mpsched: {exc}", file=sys.stderr)
        return Exit.STORE
    except (SchedulerShutdownError, ConnectionError, FileNotFoundError, EOFError) as exc:
        where = getattr(args, "connect", "?") or format_address(default_address())
        print(f"mpsched: no manager answers at {where}: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE


# ------------------------------------------------------------------------------ worker


def _worker(args: argparse.Namespace, out: TextIO) -> int:
    address, key = manager_of(args)
    # Fail fast, in this process, on a wrong address, key or version.
    _probe_until_answered(address, key)
    from mpsched._worker.pool import WorkerPool

    scrub_authkey_env()  # read: the workers and their jobs must not inherit it
    config = WorkerConfig(
        address=address,
        authkey=key,
        worker_id="",
        log_level=logging.getLogger().getEffectiveLevel(),
        heartbeat_interval=args.heartbeat_interval,
        tls=tls_from_args(args),
        queues=args.queues,
    )
    pool = WorkerPool(config, args.processes, StartMethod.default())
    print(
        f"mpsched worker: {plural(args.processes, 'process')} joined {format_address(address)}",
        file=out,
        flush=True,
    )
    return pool.run()


def _probe_until_answered(address: Address, key: bytes) -> None:
    """:func:`_probe`, tried again for as long as the manager is busy (it closes every
    handshake: a flood of idle connections), with one warning while it lasts."""
    warned = False
    while True:
        try:
            _probe(address, key)
        except ManagerBusyError as exc:
            if not warned:
                log.warning(
                    "the manager at %s is busy: %s; the pool tries again every %g s "
                    "until it answers",
                    exc.address,
                    exc.reason,
                    BUSY_PAUSE,
                )
                warned = True
            time.sleep(BUSY_PAUSE)
        else:
            if warned:
                log.warning("the manager at %s answers again", format_address(address))
            return


def _probe(address: Address, key: bytes) -> None:
    """Connect and say hello as a client: raises what a worker or producer would meet."""
    service = service_at(address, key)
    python, cp = describe_versions()
    service.open_client(
        ClientHello(client_id=f"probe-{os.getpid()}", python=python, cloudpickle=cp)
    )
    service.close_client(f"probe-{os.getpid()}")


# ------------------------------------------------------------------------------ submit


def _submit(args: argparse.Namespace, out: TextIO) -> int:
    with _by_value(args.by_value):
        return _submit_target(args, _import_target(args.target), out)


@contextlib.contextmanager
def _by_value(names: list[str]) -> Iterator[None]:
    """While submitting: the modules of ``--by-value`` are pickled by value (their code
    travels with the job), so workers need not import them."""
    modules = []
    try:
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                raise UsageError(f"--by-value {name}: cannot import it here: {exc}") from None
            cloudpickle.register_pickle_by_value(module)
            modules.append(module)
        yield
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def retry_policy(args: argparse.Namespace) -> RetryPolicy | None:
    """The retry policy of ``submit --retry N [--backoff SECONDS]``, or None."""
    if args.retry is None:
        if args.backoff is not None:
            raise UsageError("--backoff needs --retry")
        return None
    policy = (
        RetryPolicy(args.retry)
        if args.backoff is None
        else RetryPolicy(args.retry, backoff=args.backoff)
    )
    return coerce_retry(policy, args.retries)  # not with --retries


def _submit_target(args: argparse.Namespace, fn: Callable[..., Any], out: TextIO) -> int:
    call_args = _json_option("--args", args.args)
    call_kwargs = _json_option("--kwargs", args.kwargs)
    if not isinstance(call_args, list) or not isinstance(call_kwargs, dict):
        raise UsageError("--args must be a JSON list and --kwargs a JSON object")
    try:
        at = datetime.fromisoformat(args.at) if args.at else None
    except ValueError:
        raise UsageError(f"--at {args.at!r} is not an ISO 8601 time") from None
    problem = check_recurring(args)
    if problem:
        raise UsageError(problem)
    if args.after and (args.every is not None or args.cron is not None):
        raise UsageError("--after cannot go with --every or --cron: a schedule has no parents")
    args.retry = retry_policy(args)
    if args.every is not None or args.cron is not None:
        return submit_recurring(args, fn, call_args, call_kwargs, at, out)
    address, key = manager_of(args)
    client = connect(address, authkey=key)
    interrupted = False
    try:
        future = client.schedule(
            fn,
            *call_args,
            delay=args.delay,
            at=at,
            priority=args.priority,
            timeout=args.timeout,
            retries=args.retries,
            key=args.key,
            retry=args.retry,
            queue=args.queue,
            limit=args.limit,
            after=args.after,
            **call_kwargs,
        )
        try:
            print(future.job_id, file=out, flush=True)
            return print_outcome(future, out) if args.wait else Exit.OK
        except KeyboardInterrupt:
            interrupted = True
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # no traceback while we detach
            print(
                f"mpsched: interrupted; job {future.job_id} "
                f"{_left_as(client, future.job_id)} (with the same --connect)",
                file=sys.stderr,
            )
            return Exit.INTERRUPTED
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if args.wait and not interrupted:
            client.shutdown()
        else:  # without waiting; a job not sent yet is sent before detach() returns
            client.detach()


def _left_as(client: Client, job_id: str) -> str:
    """What an interrupted ``submit --wait`` leaves its job as, and what to do next."""
    result = f"python -m mpsched result {job_id} --wait gets its result"
    try:
        running = any(job.job_id == job_id for job in client.jobs("running"))
    except (MpschedError, ConnectionError, EOFError):
        return f"stays queued, or running if a worker took it: {result}"
    if running:
        return f"is running and will finish: {result}"
    return f"stays queued and will run: {result}, python -m mpsched cancel {job_id} takes it out"


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


# ------------------------------------------------------------------------------ demo, stress


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._cli.demo import run_demo

    return run_demo(out)


def _stress(args: argparse.Namespace, out: TextIO) -> int:
    from mpsched._cli.stress import run_stress
    from mpsched._cli.stress_shared import run_shared_stress

    if args.store is not None:
        if args.connect is not None:
            raise UsageError("--store starts managers of its own: no --connect with it")
        check_store(args.store, lease_timeout=args.lease_timeout)
        if not is_redis_url(args.store):
            raise UsageError(
                "--store takes a Redis URL (redis://, rediss://, unix://): "
                "only such a store is shared by several managers"
            )
        return run_shared_stress(
            store=args.store,
            managers=args.managers,
            producers=args.producers,
            workers=args.workers,
            jobs=args.jobs,
            horizon=args.horizon,
            kill_every=args.kill_every,
            lease_timeout=args.lease_timeout,
            out=out,
        )
    address: Address | None = None
    key: bytes | None = None
    tls = tls_from_args(args)
    if args.connect is not None:
        address, key = manager_of(args)
        _probe(address, key)  # before any producer starts: a wrong address fails once
    elif tls is not None:
        raise UsageError(
            "--tls-ca, --tls-cert and --tls-key need --connect: the manager "
            "stress starts itself listens on a Unix socket, without TLS"
        )
    return run_stress(
        producers=args.producers,
        workers=args.workers,
        jobs=args.jobs,
        horizon=args.horizon,
        address=address,
        authkey=key,
        tls=tls,
        inject=args.inject,
        out=out,
    )


Handler = Callable[[argparse.Namespace, TextIO], int]
HANDLERS: dict[Command, Handler] = {
    Command.SERVE: run_serve,
    Command.WORKER: _worker,
    Command.DRAIN_WORKERS: run_drain_workers,
    Command.SUBMIT: _submit,
    Command.STATUS: run_status,
    Command.JOBS: run_jobs,
    Command.SCHEDULES: run_schedules,
    Command.CANCEL: run_cancel,
    Command.REQUEUE: run_requeue,
    Command.RESULT: run_result,
    Command.DEMO: _demo,
    Command.STRESS: _stress,
}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
