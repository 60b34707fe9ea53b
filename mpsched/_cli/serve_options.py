"""The options of the commands that run processes: ``serve`` (a manager, its local
workers, its store and status page) and ``worker`` (a pool joining a manager)."""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path

from mpsched._cli import values
from mpsched._cli.options import CONNECT_HELP, KEY_HELP, tls_options
from mpsched._core.job import Order
from mpsched._core.options import Durability
from mpsched._protocol.records import HEARTBEAT_TIMEOUT, LEASE_TIMEOUT
from mpsched._transport.authkey import AUTHKEY_ENV

STORE_ENV = "MPSCHED_STORE"


def serve_options(serve: argparse.ArgumentParser) -> None:
    """The options of ``serve``, in the order its --help lists them."""
    _listen_options(serve)
    _queue_options(serve)
    _store_options(serve)
    _drain_options(serve)
    tls_options(serve, serving=True)
    _http_options(serve)


def _listen_options(serve: argparse.ArgumentParser) -> None:
    """Where the manager listens, its local workers, and its key."""
    serve.add_argument(
        "--address",
        help="where to listen: unix:PATH or HOST:PORT (port 0: "
        "any free port; default: as this user's local "
        "manager, on the socket in the per-user runtime "
        "directory, where the other commands look)",
    )
    serve.add_argument(
        "--workers",
        type=values.count_or_zero,
        default=os.cpu_count() or 1,
        help="local worker processes (default: %(default)s, the number of "
        "cores; 0 for remote workers only)",
    )
    serve.add_argument(
        "--authkey-file",
        type=Path,
        metavar="FILE",
        help=f"file holding the key, mode 0600 (default: ${AUTHKEY_ENV}, "
        f"else this user's local key in the runtime directory, written "
        f"at the first serve and kept)",
    )


def _queue_options(serve: argparse.ArgumentParser) -> None:
    """How the manager orders and bounds its queue, and how long a remote worker may be silent."""
    serve.add_argument(
        "--order",
        choices=values.words(Order),
        default=Order.TIME,
        help="time: earliest due first, then priority; priority: among "
        "jobs already due, highest priority first (default: "
        "%(default)s)",
    )
    serve.add_argument(
        "--queues",
        type=values.queues,
        metavar="NAMES",
        help="the queues the local workers serve, in strict order, comma "
        "separated: gpu,default (default: every queue)",
    )
    serve.add_argument(
        "--limit",
        type=values.limit,
        action="append",
        default=[],
        metavar="NAME=FORM",
        help="declare a limit jobs may name: exports=2 (at most 2 running "
        "at once), api=10/s (at most 10 starts a second; also /m, /h), "
        "both=2,10/s; repeatable",
    )
    serve.add_argument(
        "--max-pending",
        type=values.count,
        metavar="JOBS",
        help="most jobs waiting in the queue; a submit waits for room (default: no limit)",
    )
    serve.add_argument(
        "--max-pending-bytes",
        type=values.count,
        metavar="BYTES",
        help="most bytes the payloads of waiting jobs may hold; a submit "
        "waits for room (default: no limit)",
    )
    serve.add_argument(
        "--heartbeat-timeout",
        type=values.seconds,
        default=HEARTBEAT_TIMEOUT,
        metavar="SECONDS",
        help="seconds of silence after which a remote worker is declared "
        "gone and its jobs are requeued or failed (default: %(default)s)",
    )


def _store_options(serve: argparse.ArgumentParser) -> None:
    """Where the manager keeps its jobs, and for how long their outcomes."""
    store = serve.add_argument_group(
        "job store",
        textwrap.fill(
            "Without a store, jobs live in the manager's memory and end with it. With a SQLite "
            "file, a manager started again on it gets back its pending jobs, and its running "
            "ones are retried (if their retries allow) or failed. With a Redis URL, every "
            "manager on it (serve or Scheduler, on any host) shares one queue: a job runs on "
            "whichever has an idle worker, and the jobs of a manager that dies are taken back "
            "by the others.",
            77,
        ),
    )
    store.add_argument(
        "--store",
        metavar="FILE|URL",
        default=os.environ.get(STORE_ENV),
        help=f"keep the jobs in this SQLite file (created if missing; one "
        f"manager per file), or in the Redis server of a redis://, "
        f"rediss:// or unix:// URL (?db=N, ?prefix=NAME; needs "
        f"mpsched[redis]) (default: ${STORE_ENV}, else in memory)",
    )
    store.add_argument(
        "--lease-timeout",
        type=values.seconds,
        default=LEASE_TIMEOUT,
        metavar="SECONDS",
        help="with a Redis store: seconds without a heartbeat after which "
        "the other managers presume this one dead and take back its "
        "jobs (default: %(default)s)",
    )
    store.add_argument(
        "--durability",
        choices=values.words(Durability),
        default=Durability.SYNC,
        help="sync: an acknowledged submit or cancel survives a power cut "
        "(SQLite synchronous=FULL), and a job's start and end reach "
        "the disk within milliseconds (group commit); process: they "
        "survive a crash of the manager process, not a power cut or "
        "an OS crash (synchronous=NORMAL, no fsync) (default: "
        "%(default)s)",
    )
    store.add_argument(
        "--result-ttl",
        type=values.seconds_or_zero,
        default=86400.0,
        metavar="SECONDS",
        help="seconds a finished job's outcome stays retrievable by its id "
        "(result, jobs): in the store, or without one in memory (at "
        "most 100,000 jobs and 64 MiB of outcomes, oldest dropped "
        "first); a cancelled schedule's latest runs stay listable as "
        "long (default: %(default)s, one day)",
    )


def _drain_options(serve: argparse.ArgumentParser) -> None:
    """What the manager does on stop: with its running jobs, with remote worker pools."""
    serve.add_argument(
        "--drain-timeout",
        type=values.seconds_or_zero,
        default=30.0,
        metavar="SECONDS",
        help="on the first SIGTERM or SIGINT, seconds running jobs may take "
        "to finish before their workers are killed (default: "
        "%(default)s)",
    )
    serve.add_argument(
        "--drain-workers-on-stop",
        action="store_true",
        help="on stop, remote worker pools drain and exit 0, as with "
        "drain-workers (default: they wait for a manager to come back "
        "at the address)",
    )


def _http_options(serve: argparse.ArgumentParser) -> None:
    http = serve.add_argument_group(
        "status page and metrics",
        textwrap.fill(
            "A live page (GET /), Prometheus metrics (GET /metrics) and a JSON API (GET "
            "/api/status, /api/jobs), served by the manager itself. On a loopback address it "
            "may serve without a token, read-only. Any other address needs a token file and "
            "TLS (the manager's --tls-cert/--tls-key). With a token, every request carries it "
            "(Authorization: Bearer TOKEN; for the page, open URL#token=TOKEN), and may also "
            "cancel pending jobs and pause or resume schedules.",
            77,
        ),
    )
    http.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve the status page and metrics there; a port alone listens "
        "on 127.0.0.1, this machine only (port 0: any free port; "
        "default: none)",
    )
    http.add_argument(
        "--http-token-file",
        type=Path,
        metavar="FILE",
        help="file holding the token every request must carry (mode "
        "0600; printable ASCII without spaces)",
    )


def worker_options(worker: argparse.ArgumentParser) -> None:
    worker.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    worker.add_argument(
        "--processes",
        type=values.count,
        default=os.cpu_count() or 1,
        help="worker processes to start (default: %(default)s, the number of cores)",
    )
    worker.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    worker.add_argument(
        "--queues",
        type=values.queues,
        metavar="NAMES",
        help="the queues these workers serve, in strict order, comma "
        "separated: gpu,default (default: every queue)",
    )
    worker.add_argument(
        "--heartbeat-interval",
        type=values.seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between a worker's heartbeats to the manager; at most "
        "a quarter of its heartbeat timeout (default: %(default)s)",
    )
    tls_options(worker, serving=False)
