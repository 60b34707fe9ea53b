"""The options of each command of ``python -m mpsched``, their help texts, and the types
that read their values (seconds, counts, intervals), each saying what it wants in the same
words. :mod:`mpsched._cli.parser` puts them together.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path

from mpsched._core.job import JobState, Order, Priority, check_name, check_queues
from mpsched._core.limits import parse_limit
from mpsched._core.options import Catchup, Durability, Mode, OnError, Option, Overlap
from mpsched._core.recurring import MIN_INTERVAL, interval_problem
from mpsched._protocol.records import HEARTBEAT_TIMEOUT, LEASE_TIMEOUT
from mpsched._transport.authkey import AUTHKEY_ENV
from mpsched._transport.tls import TlsConfig

STORE_ENV = "MPSCHED_STORE"


class Injection(Option):
    """A fault ``stress --inject`` plants in the run log before verifying it: it exists only
    to prove the verifier catches it (a test runs each and expects FAIL)."""

    DUPLICATE = "duplicate"  # the log's first key, once more
    LOSS = "loss"  # the log's first key, dropped


CONNECT_HELP = (
    "the manager's address, as serve prints it: unix:PATH or HOST:PORT "
    "(default: this user's local manager)"
)
KEY_HELP = (
    f"file holding the manager's key, mode 0600 (default: ${AUTHKEY_ENV}, else, "
    f"for a local address, this user's local key)"
)


def status_options(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "--json",
        action="store_true",
        help="print the status as JSON (times in seconds, memory and the store's size in bytes)",
    )


def schedules_options(schedules: argparse.ArgumentParser) -> None:
    schedules.add_argument(
        "--json",
        action="store_true",
        help="print the schedules as JSON (times as UTC ISO 8601; "
        "next_run_id: the job id of the run queued for next_run, "
        "last_run: of the latest run that started)",
    )


def cancel_options(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument(
        "job_id", metavar="ID", help="a job's id, as submit printed it, or a schedule's id"
    )


def tls_options(p: argparse.ArgumentParser, *, serving: bool) -> None:
    group = p.add_argument_group(
        "TLS (TCP addresses only; the authkey is still required)",
        textwrap.fill(
            "Without TLS, traffic after the authkey handshake is plaintext "
            "pickles: use it on any network you do not trust. Files are PEM.",
            77,
        )
        if serving
        else None,
    )
    if serving:
        group.add_argument(
            "--tls-cert",
            type=Path,
            metavar="FILE",
            help="serve TLS with this certificate (its local workers verify "
            "it with --tls-ca, or with the certificate itself when it "
            "is self-signed); --http serves HTTPS with it too",
        )
        group.add_argument(
            "--tls-key",
            type=Path,
            metavar="FILE",
            help="the certificate's private key (default: in --tls-cert)",
        )
        group.add_argument(
            "--tls-ca",
            type=Path,
            metavar="FILE",
            help="require every client and worker to present a certificate signed by this CA",
        )
    else:
        group.add_argument(
            "--tls-ca",
            type=Path,
            metavar="FILE",
            help="connect with TLS and verify the manager's certificate with "
            "this CA (a self-signed certificate is its own CA)",
        )
        group.add_argument(
            "--tls-cert",
            type=Path,
            metavar="FILE",
            help="the client certificate to present, if the manager requires one",
        )
        group.add_argument(
            "--tls-key",
            type=Path,
            metavar="FILE",
            help="that certificate's private key (default: in --tls-cert)",
        )


def client_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a running manager: where, key, TLS."""
    p.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    p.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    tls_options(p, serving=False)
    return p


def jobs_options(jobs: argparse.ArgumentParser) -> None:
    jobs.add_argument(
        "--state",
        choices=[state.value for state in JobState],
        help="only jobs in this state (default: all; finished jobs are "
        "listed for --result-ttl seconds, in memory within bounds "
        "without --store)",
    )
    jobs.add_argument(
        "--limit",
        type=_count,
        metavar="N",
        help="at most N jobs, the first in submission order (default: all)",
    )
    jobs.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list; due as an ISO 8601 UTC time and due_in in "
        "seconds from now (negative: overdue)",
    )


def result_options(result: argparse.ArgumentParser) -> None:
    result.add_argument("job_id", metavar="JOB_ID", help="the job's id, as submit printed it")
    result.add_argument(
        "--wait",
        action="store_true",
        help="wait until the job has finished (default: exit 124 at once if "
        "it is still pending or running); Ctrl-C stops waiting and "
        "leaves the job as it is, queued or running",
    )
    result.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="with --wait: seconds to wait at most, then exit 124 (default: no limit)",
    )
    result.add_argument(
        "--json",
        action="store_true",
        help='print {"job_id", "state", ...} as JSON, whatever the state: '
        'a result JSON can hold as "result", any other as its repr '
        'in "result_repr"; a failure as "error" with its "type", '
        '"message" and the worker\'s "traceback" (null when none)',
    )


def tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS setting the --tls-* options ask for; None without any of them."""
    cert, key, ca = (getattr(args, f"tls_{name}", None) for name in ("cert", "key", "ca"))
    return None if not (cert or key or ca) else TlsConfig(cert=cert, key=key, ca=ca)


def serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--address",
        help="where to listen: unix:PATH or HOST:PORT (port 0: "
        "any free port; default: as this user's local "
        "manager, on the socket in the per-user runtime "
        "directory, where the other commands look)",
    )
    serve.add_argument(
        "--workers",
        type=_count_or_zero,
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
    serve.add_argument(
        "--order",
        choices=_words(Order),
        default=Order.TIME,
        help="time: earliest due first, then priority; priority: among "
        "jobs already due, highest priority first (default: "
        "%(default)s)",
    )
    serve.add_argument(
        "--queues",
        type=_queues,
        metavar="NAMES",
        help="the queues the local workers serve, in strict order, comma "
        "separated: gpu,default (default: every queue)",
    )
    serve.add_argument(
        "--limit",
        type=_limit,
        action="append",
        default=[],
        metavar="NAME=FORM",
        help="declare a limit jobs may name: exports=2 (at most 2 running "
        "at once), api=10/s (at most 10 starts a second; also /m, /h), "
        "both=2,10/s; repeatable",
    )
    serve.add_argument(
        "--max-pending",
        type=_count,
        metavar="JOBS",
        help="most jobs waiting in the queue; a submit waits for room (default: no limit)",
    )
    serve.add_argument(
        "--max-pending-bytes",
        type=_count,
        metavar="BYTES",
        help="most bytes the payloads of waiting jobs may hold; a submit "
        "waits for room (default: no limit)",
    )
    serve.add_argument(
        "--heartbeat-timeout",
        type=_seconds,
        default=HEARTBEAT_TIMEOUT,
        metavar="SECONDS",
        help="seconds of silence after which a remote worker is declared "
        "gone and its jobs are requeued or failed (default: %(default)s)",
    )
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
        type=_seconds,
        default=LEASE_TIMEOUT,
        metavar="SECONDS",
        help="with a Redis store: seconds without a heartbeat after which "
        "the other managers presume this one dead and take back its "
        "jobs (default: %(default)s)",
    )
    store.add_argument(
        "--durability",
        choices=_words(Durability),
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
        type=_seconds_or_zero,
        default=86400.0,
        metavar="SECONDS",
        help="seconds a finished job's outcome stays retrievable by its id "
        "(result, jobs): in the store, or without one in memory (at "
        "most 100,000 jobs and 64 MiB of outcomes, oldest dropped "
        "first); a cancelled schedule's latest runs stay listable as "
        "long (default: %(default)s, one day)",
    )
    serve.add_argument(
        "--drain-timeout",
        type=_seconds_or_zero,
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
    tls_options(serve, serving=True)
    _http_options(serve)


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
        type=_count,
        default=os.cpu_count() or 1,
        help="worker processes to start (default: %(default)s, the number of cores)",
    )
    worker.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    worker.add_argument(
        "--queues",
        type=_queues,
        metavar="NAMES",
        help="the queues these workers serve, in strict order, comma "
        "separated: gpu,default (default: every queue)",
    )
    worker.add_argument(
        "--heartbeat-interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between a worker's heartbeats to the manager; at most "
        "a quarter of its heartbeat timeout (default: %(default)s)",
    )
    tls_options(worker, serving=False)


def submit_options(submit: argparse.ArgumentParser) -> None:
    submit.add_argument(
        "target",
        help="module:function, importable here and on the workers (or sent with --by-value)",
    )
    submit.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    submit.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    _job_options(submit)
    tls_options(submit, serving=False)
    submit.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job and print its result: as JSON, or, when JSON "
        "cannot hold it (a set, an object), its repr, said on stderr; "
        "a failure prints the worker's traceback on stderr. Ctrl-C "
        "stops waiting and leaves the job as it is, queued or running",
    )
    _recurring_options(submit)


def _job_options(submit: argparse.ArgumentParser) -> None:
    """What ``submit`` asks of one job: its arguments, time, priority and limits."""
    submit.add_argument(
        "--args", default="[]", metavar="JSON", help="JSON list of positional arguments"
    )
    submit.add_argument(
        "--kwargs", default="{}", metavar="JSON", help="JSON object of keyword arguments"
    )
    when = submit.add_mutually_exclusive_group()
    when.add_argument(
        "--delay",
        type=float,
        metavar="SECONDS",
        help="due this many seconds after the manager receives the job (default: due now)",
    )
    when.add_argument(
        "--at",
        metavar="TIME",
        help="due at this ISO 8601 time, as 2026-12-03T02:00 (naive means local time)",
    )
    submit.add_argument(
        "--priority",
        choices=[p.name.lower() for p in Priority],
        default=Priority.MEDIUM.name.lower(),
        help="among jobs due at the same time, high runs before medium "
        "before low (default: %(default)s)",
    )
    submit.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="seconds the job may run once a worker takes it; then its "
        "process tree is killed and the job fails (default: none)",
    )
    submit.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="times to run the job again if its worker dies under it (default: %(default)s)",
    )
    submit.add_argument(
        "--retry",
        type=int,
        metavar="N",
        help="a retry policy: run the job again up to N times when it "
        "raises or its worker dies, with back-off (not with --retries)",
    )
    submit.add_argument(
        "--backoff",
        type=float,
        metavar="SECONDS",
        help="with --retry: seconds before the first retry, doubling for "
        "each next one, up to 600 (default: 1)",
    )
    submit.add_argument(
        "--queue",
        type=_queue_name,
        default="default",
        metavar="NAME",
        help="the queue it waits in: only workers serving it run it (default: %(default)s)",
    )
    submit.add_argument(
        "--limit",
        type=_limit_name,
        metavar="NAME",
        help="a limit the manager declares (serve --limit): the job starts "
        "only while that limit has room",
    )
    submit.add_argument(
        "--by-value",
        action="append",
        default=[],
        metavar="MODULE",
        help="send MODULE's code with the job (pickled by value), for a "
        "module the workers cannot import; importable here, it may be "
        "a package (its submodules go too); repeatable",
    )
    submit.add_argument(
        "--after",
        action="append",
        metavar="JOB_ID",
        help="run the job once the job JOB_ID has ended (it fails if that "
        "one fails or is cancelled); repeatable",
    )
    submit.add_argument(
        "--key",
        metavar="KEY",
        help="an idempotency key: while a job with this key is pending or "
        "running (or its outcome kept by a store), submit prints that "
        "job's id and queues nothing",
    )


def _recurring_options(submit: argparse.ArgumentParser) -> None:
    """``submit --every`` and ``--cron``: a schedule, and how its runs go."""
    recurring = submit.add_argument_group(
        "recurring",
        textwrap.fill(
            "With --every or --cron the callable runs on a schedule kept by the manager (and "
            "by its store, across restarts); submit prints the schedule's id. With --every, "
            "--delay or --at sets the first run (default: one interval from now).",
            77,
        ),
    )
    how = recurring.add_mutually_exclusive_group()
    how.add_argument(
        "--every",
        type=_interval,
        metavar="SECONDS",
        help=f"run every SECONDS (at least {MIN_INTERVAL:g}): with --mode rate "
        f"at start + k * SECONDS (no drift), with --mode delay SECONDS "
        f"after the previous run ended",
    )
    how.add_argument(
        "--cron",
        metavar="EXPR",
        help="run at the times of a five-field cron expression, as "
        "'30 2 * * 1-5' (needs pip install 'mpsched[cron]')",
    )
    recurring.add_argument(
        "--tz",
        metavar="ZONE",
        help="the zone --cron is read in, as Europe/Berlin (default: the manager's local zone)",
    )
    recurring.add_argument(
        "--id",
        dest="schedule_id",
        metavar="NAME",
        help="the schedule's name; submitting it again with the same "
        "spec changes nothing, with another replaces it (default: "
        "derived from the callable and the spec)",
    )
    recurring.add_argument(
        "--mode",
        choices=_words(Mode),
        default=Mode.RATE,
        help="with --every: rate plans runs at start + k * SECONDS; delay "
        "plans each run SECONDS after the previous one ended "
        "(default: %(default)s)",
    )
    recurring.add_argument(
        "--overlap",
        choices=_words(Overlap),
        default=Overlap.SKIP,
        help="a run due while the previous one is pending or running: "
        "skip it, queue it until that one ends, or allow both "
        "(default: %(default)s)",
    )
    recurring.add_argument(
        "--catchup",
        choices=_words(Catchup),
        default=Catchup.LATEST,
        help="runs missed while the manager was down or busy: run the "
        "latest one, all of them, or none (default: %(default)s)",
    )
    recurring.add_argument(
        "--jitter",
        type=_seconds_or_zero,
        default=0.0,
        metavar="SECONDS",
        help="start each run up to SECONDS after its time, the same "
        "offset for a given time across restarts (default: 0)",
    )
    recurring.add_argument(
        "--on-error",
        choices=_words(OnError),
        default=OnError.CONTINUE,
        help="a run that fails: continue the schedule, or pause it (default: %(default)s)",
    )


def stress_options(stress: argparse.ArgumentParser) -> None:
    stress.add_argument(
        "--producers",
        type=_count,
        default=3,
        help="producer processes submitting at once (default: %(default)s)",
    )
    stress.add_argument(
        "--workers",
        type=_count,
        default=2,
        help="worker processes of the manager started for the run; ignored "
        "with --connect (default: %(default)s)",
    )
    stress.add_argument(
        "--jobs",
        type=_count,
        default=3000,
        help="jobs in all, shared by the producers (default: %(default)s)",
    )
    stress.add_argument(
        "--horizon",
        type=_seconds_or_zero,
        default=2.0,
        metavar="SECONDS",
        help="each job is due a random 0 to SECONDS after its submission (default: %(default)s)",
    )
    stress.add_argument(
        "--connect", metavar="ADDRESS", help="flood this running manager instead of starting one"
    )
    stress.add_argument(
        "--authkey-file", type=Path, metavar="FILE", help=f"with --connect: {KEY_HELP}"
    )
    tls_options(stress, serving=False)
    shared = stress.add_argument_group(
        "several managers on one Redis store",
        textwrap.fill(
            "With --store URL, the run starts --managers serve processes on that Redis store "
            "(each with --workers workers), the producers connect to them in turn, and every "
            "--kill-every seconds one manager is killed with its workers and started again: "
            "every job must still run once (or, if its manager died as it ran, at most once, "
            "failing with WorkerCrashedError).",
            77,
        ),
    )
    shared.add_argument(
        "--store",
        metavar="URL",
        help="a Redis URL (redis://, rediss://, unix://); needs mpsched[redis]",
    )
    shared.add_argument(
        "--managers", type=_count, default=3, help="managers on the store (default: %(default)s)"
    )
    shared.add_argument(
        "--kill-every",
        type=_seconds,
        metavar="SECONDS",
        help="SIGKILL a manager this often, then start it again (default: never)",
    )
    shared.add_argument(
        "--lease-timeout",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="each manager's lease: how soon its peers take back what a "
        "killed one ran (default: %(default)s)",
    )
    stress.add_argument(
        "--inject", choices=_words(Injection), help=argparse.SUPPRESS
    )  # proves the verifier catches faults


def _queues(text: str) -> tuple[str, ...] | None:
    try:
        return check_queues(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _queue_name(text: str) -> str:
    try:
        return check_name("queue", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit_name(text: str) -> str:
    try:
        return check_name("limit", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> tuple[str, str]:
    name, sep, form = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"a limit is NAME=FORM (exports=2), not {text!r}")
    try:
        return name, str(parse_limit(name.strip(), form.strip()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    value = _count_or_zero(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _count_or_zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _seconds(text: str) -> float:
    return _seconds_from(text, 0.0, inclusive=False)


def _seconds_or_zero(text: str) -> float:
    return _seconds_from(text, 0.0, inclusive=True)


def _interval(text: str) -> float:
    """``--every``: the rule ``every()`` holds an interval to, in its words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    problem = interval_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem.replace(f"{value:g}", text))
    return value


def _seconds_from(text: str, least: float, *, inclusive: bool) -> float:
    """``text`` as seconds, finite and at least (or, not ``inclusive``, more than)
    ``least``; every option of seconds says what it wants in the same words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= least if inclusive else value > least) or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds {'>=' if inclusive else '>'} {least:g}, not {text}"
        )
    return value


def _words(option: type[Option]) -> list[str]:
    """An option's words, as argparse's choices (shown in --help and its errors)."""
    return [str(member) for member in option]
